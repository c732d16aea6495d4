//! `voxtile completions SHELL`: the shell completion script, from the same clap definition that
//! parses the arguments (so it cannot drift from the flags).

use clap::CommandFactory;

/// Print the completion script for `shell` on standard output.
pub fn print(shell: clap_complete::Shell) -> crate::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "voxtile", &mut script);
    super::print_stdout(&String::from_utf8_lossy(&script))
}
