use voxtile::internals;

fn main() {
    // Before anything is written: on SIGINT/SIGTERM/SIGHUP, temp outputs are removed and the
    // process exits 128 + signal.
    internals::signals::install();
    // Before any parallel work: a thread count that fits an address-space limit.
    internals::init_thread_pool();
    std::process::exit(internals::cli::run());
}
