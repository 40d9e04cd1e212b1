//! Compiles the verbs shim (shim/verbs_shim.c) with the system C compiler against rdma-core's
//! <infiniband/verbs.h>: ibv_post_send, ibv_poll_cq and ibv_req_notify_cq are inline calls through
//! context->ops there, and the extended verbs (ibv_create_cq_ex, ibv_create_qp_ex, ibv_wr_*,
//! ibv_start_poll) inline calls through the verbs_context and the ibv_qp_ex / ibv_cq_ex function
//! pointers. Both dialects are always compiled (cargo feature verbs-ex picks one in src/verbs.rs). The
//! verbs library itself is dlopen'ed at run time, never linked.
use std::env;
use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        status.success(),
        "{cmd:?} failed ({status}); the shim needs cc, ar and libibverbs-dev"
    );
}

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let cc = env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let obj = out.join("verbs_shim.o");
    run(Command::new(&cc)
        .args([
            "-O2",
            "-fPIC",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-c",
            "shim/verbs_shim.c",
            "-o",
        ])
        .arg(&obj));
    run(Command::new("ar")
        .arg("crs")
        .arg(out.join("liborbite_verbs_shim.a"))
        .arg(&obj));
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static=orbite_verbs_shim");
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rerun-if-changed=shim/verbs_shim.c");
    println!("cargo:rerun-if-env-changed=CC");
}
