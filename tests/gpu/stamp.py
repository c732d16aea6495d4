"""Run a command and print each of its stderr lines with the seconds since it was spawned, then
its exit: wall, user and system CPU seconds, peak RSS (where the process's time goes, for W3).
usage: python3 tests/gpu/stamp.py CMD [ARGS...]"""
import os, resource, subprocess, sys, time

t0 = time.monotonic()
p = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
last = None
for line in p.stderr:
    last = time.monotonic() - t0
    print(f"{last:7.3f} {line.rstrip()}", flush=True)
_, status, ru = os.wait4(p.pid, 0)
end = time.monotonic() - t0
print(f"{end:7.3f} exit {os.waitstatus_to_exitcode(status)}: wall {end:.3f} s, after the last line "
      f"{end - (last or 0):.3f} s, user {ru.ru_utime:.3f} s, sys {ru.ru_stime:.3f} s, "
      f"max RSS {ru.ru_maxrss / 1024:.0f} MiB")
