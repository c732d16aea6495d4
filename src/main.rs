fn main() {
    std::process::exit(voxtile::cli::run());
}
