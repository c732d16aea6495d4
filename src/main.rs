fn main() {
    // Before anything is written: on SIGINT/SIGTERM/SIGHUP, temp outputs are removed and the
    // process exits 128 + signal.
    voxtile::signals::install();
    std::process::exit(voxtile::cli::run());
}
