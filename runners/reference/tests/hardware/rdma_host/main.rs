//! The installed-host fixture of the reference runner: the whole runner contract
//! (docs/runner-contract.md) is the library's; this binary only hands it the command line.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(orbite_reference::main_with_args(&args));
}
