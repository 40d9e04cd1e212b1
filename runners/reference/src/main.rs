//! `orbite-rdma-host`: the reference runner's binary (docs/runner-contract.md).

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(orbite_reference::main_with_args(&args));
}
