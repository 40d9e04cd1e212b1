//! Command line, the ledger's life and the mapping of outcomes to exit codes
//! (docs/runner-contract.md sections 1 and 5).
//!
//! Signals: SIGTERM and SIGKILL keep their default action, so a killed runner leaves its last
//! checkpoint (`status: "running"`) and writes nothing more, as the contract says.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use crate::case::{self, Case, PROTOCOL};
use crate::engine::{self, Engine, EngineError, EXIT_CASE_ERROR, EXIT_CHECK_FAILED, EXIT_INTERNAL, EXIT_OK};
use crate::json::Json;
use crate::verbs;

pub const RUNNER_NAME: &str = "orbite-reference-runner";
pub const RUNNER_VERSION: &str = env!("CARGO_PKG_VERSION");

fn base_ledger(defects: &[String]) -> Json {
    Json::obj()
        .with("schema", "orbite.runner-ledger")
        .with("version", 1)
        .with("protocol", PROTOCOL)
        .with("status", "running")
        .with("exit_code", Json::Null)
        .with(
            "runner",
            Json::obj()
                .with("kind", "native")
                .with("name", RUNNER_NAME)
                .with("version", RUNNER_VERSION)
                .with("defects", defects.to_vec()),
        )
        .with("pid", std::process::id())
        .with("started_at", engine::now())
        .with("finished_at", Json::Null)
        .with("errors", Json::Arr(Vec::new()))
}

fn case_ledger(doc: Json, case: &Case) -> Json {
    let requester = case.role == "requester";
    doc.with("run_id", case.run_id.as_str())
        .with("role", case.role.as_str())
        .with("generation", case.generation)
        .with("mode", case.mode.as_str())
        .with("operation", case.operation.as_str())
        .with("rdma_events", case.rdma_events)
        .with("progress", if case.rdma_events { "events" } else { "polling" })
        .with("hostname", Json::Null)
        .with("boot_id", Json::Null)
        .with("root", case.root.as_str())
        .with("epoch", Json::Null)
        .with("peer_epoch", Json::Null)
        .with("registration_id", case.registration_id.as_str())
        .with("peer_registration_id", case.peer_registration_id.clone())
        .with("service_address", Json::Null)
        .with("verbs_library", Json::Null)
        .with("peer_address", if requester { case.peer_address.clone() } else { None })
        .with("profile", case.profile.clone())
        .with("workload", Json::Null)
        .with("rails", Json::Arr(Vec::new()))
        .with("discovery", Json::Null)
        .with("contexts", Json::Arr(Vec::new()))
        .with("qps", Json::Arr(Vec::new()))
        .with("rounds", Json::Arr(Vec::new()))
        .with("teardown", Json::Null)
        .with("totals", Json::Null)
        .with("restart", Json::Null)
}

fn finish(path: &std::path::Path, mut doc: Json, status: &str, code: i32) {
    doc.set("status", status);
    doc.set("exit_code", code);
    doc.set("finished_at", engine::now());
    if let Err(e) = engine::write_atomic(path, &doc.to_text()) {
        eprintln!("orbite-runner: cannot write {}: {e}", path.display());
    }
}

fn push_error(doc: &mut Json, err: Json) {
    if let Some(Json::Arr(errors)) = doc.get_mut("errors") {
        errors.push(err);
    }
}

const USAGE: &str = "usage: orbite-rdma-host --protocol | --case <case.json> --output <dir>";

/// The whole runner; returns the process exit code.
pub fn main_with_args(args: &[String]) -> i32 {
    let (mut case_path, mut output, mut protocol) = (None, None, false);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--protocol" => protocol = true,
            "--case" => case_path = it.next().cloned(),
            "--output" => output = it.next().cloned(),
            other => {
                eprintln!("orbite-runner: command line: unknown argument '{other}' ({USAGE})");
                return EXIT_CASE_ERROR;
            }
        }
    }
    if protocol {
        println!("{PROTOCOL}");
        return EXIT_OK;
    }
    let (Some(case_path), Some(output)) = (case_path, output) else {
        eprintln!("orbite-runner: command line: --case and --output are required (or --protocol) ({USAGE})");
        return EXIT_CASE_ERROR;
    };
    if std::env::var_os("RDMAV_ALLOW_DISASSOC_DESTROY").is_some() {
        eprintln!("orbite-runner: RDMAV_ALLOW_DISASSOC_DESTROY is set; it would turn a destroy EIO into success");
        return EXIT_CASE_ERROR;
    }
    let out = PathBuf::from(&output);
    {
        use std::os::unix::fs::DirBuilderExt;
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&out) {
            eprintln!("orbite-runner: --output '{output}': cannot be created ({e})");
            return EXIT_CASE_ERROR;
        }
    }
    let ledger_path = out.join("ledger.json");
    let loaded = case::load(&case_path)
        .map_err(|e| e.0)
        .and_then(|c| verbs::load(&c.verbs_library, &c.root).map(|lib| (c, lib)));
    let (case, library) = match loaded {
        Ok(v) => v,
        Err(message) => {
            eprintln!("orbite-runner: {message}");
            let mut doc = base_ledger(&[]);
            push_error(
                &mut doc,
                EngineError::new("InvalidArgument", "case", &message).to_json(),
            );
            finish(&ledger_path, doc, "case_error", EXIT_CASE_ERROR);
            return EXIT_CASE_ERROR;
        }
    };
    println!(
        "orbite-runner: role={} generation={} pid={}",
        case.role,
        case.generation,
        std::process::id()
    );
    let doc = case_ledger(base_ledger(&case.defects), &case);
    let mut engine = Engine::new(case, out, doc, library);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        if engine.case.role == "source" {
            engine.run_source()
        } else {
            engine.run_requester()
        }
    }));
    let mut code = EXIT_OK;
    match outcome {
        Ok(Ok(())) => {
            if engine.checks_failed {
                code = EXIT_CHECK_FAILED;
            }
        }
        Ok(Err(mut err)) => {
            eprintln!("orbite-runner: {err}");
            if err.round.is_none() && engine.round_no > 0 {
                err.round = Some(engine.round_no);
            }
            push_error(&mut engine.doc, err.to_json());
            code = err.exit_code();
        }
        Err(panic) => {
            let text = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".to_string());
            push_error(&mut engine.doc, EngineError::new("Internal", "runner", &text).to_json());
            code = EXIT_INTERNAL;
        }
    }
    engine.abort();
    engine.totals();
    let doc = std::mem::replace(&mut engine.doc, Json::Null);
    finish(
        &ledger_path,
        doc,
        if code == EXIT_OK { "complete" } else { "failed" },
        code,
    );
    code
}
