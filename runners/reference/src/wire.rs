//! The rendezvous: one TCP connection of length-prefixed JSON control messages (4-byte big-endian
//! length, then the JSON text). It carries QPN/GID/rkey/address, seeds and drain state, never
//! payload. Every message has `kind`, the sender's `epoch` and the `peer_epoch` it expects; traffic
//! is counted per round by the message's `round` field (None = session set-up and BYE), so both
//! peers attribute every message to the same round.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::engine::EngineError;
use crate::json::{self, Json};

const MAX_MESSAGE: usize = 1 << 20;

/// messages_sent, messages_received, bytes_sent, bytes_received
type Traffic = Arc<Mutex<HashMap<Option<i64>, [u64; 4]>>>;

pub struct Rendezvous {
    stream: TcpStream,
    pub epoch: u64,
    pub peer_epoch: Option<u64>,
    traffic: Traffic,
    inbox: Receiver<Result<Json, String>>,
    reader: Option<JoinHandle<()>>,
}

pub fn connect(host: &str, port: u16, timeout: f64) -> Result<TcpStream, EngineError> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        match (host, port).to_socket_addrs() {
            Ok(addrs) => {
                for addr in addrs {
                    match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            return Ok(s);
                        }
                        Err(e) => last = e.to_string(),
                    }
                }
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(EngineError::new(
        "Timeout",
        "connect",
        &format!("rendezvous {host}:{port} unreachable within {timeout} s ({last})"),
    ))
}

pub fn accept(listener: &TcpListener, timeout: f64) -> Result<TcpStream, EngineError> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    listener
        .set_nonblocking(true)
        .map_err(|e| EngineError::new("Internal", "accept", &e.to_string()))?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(|e| EngineError::new("Internal", "accept", &e.to_string()))?;
                let _ = s.set_nodelay(true);
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    return Err(EngineError::new(
                        "Timeout",
                        "accept",
                        &format!("no rendezvous connection within {timeout} s"),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(EngineError::new("PeerLost", "accept", &e.to_string())),
        }
    }
}

fn round_of(msg: &Json) -> Option<i64> {
    msg.get("round").and_then(Json::as_int).map(|r| r as i64)
}

impl Rendezvous {
    pub fn new(stream: TcpStream, epoch: u64) -> Result<Rendezvous, EngineError> {
        let traffic: Traffic = Arc::default();
        let (tx, inbox) = channel();
        let mut rd = stream
            .try_clone()
            .map_err(|e| EngineError::new("Internal", "rendezvous", &e.to_string()))?;
        let counts = Arc::clone(&traffic);
        let reader = std::thread::spawn(move || loop {
            let mut head = [0u8; 4];
            if let Err(e) = rd.read_exact(&mut head) {
                let _ = tx.send(Err(format!("connection closed ({e})")));
                return;
            }
            let len = u32::from_be_bytes(head) as usize;
            if len > MAX_MESSAGE {
                let _ = tx.send(Err(format!("message of {len} bytes exceeds {MAX_MESSAGE}")));
                return;
            }
            let mut body = vec![0u8; len];
            if let Err(e) = rd.read_exact(&mut body) {
                let _ = tx.send(Err(format!("EOF inside a message ({e})")));
                return;
            }
            let msg = match std::str::from_utf8(&body)
                .map_err(|e| e.to_string())
                .and_then(json::parse)
            {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(Err(format!("bad message: {e}")));
                    return;
                }
            };
            {
                let mut t = counts.lock().expect("traffic lock");
                let bucket = t.entry(round_of(&msg)).or_insert([0; 4]);
                bucket[1] += 1;
                bucket[3] += 4 + len as u64;
            }
            if tx.send(Ok(msg)).is_err() {
                return;
            }
        });
        Ok(Rendezvous {
            stream,
            epoch,
            peer_epoch: None,
            traffic,
            inbox,
            reader: Some(reader),
        })
    }

    /// This round's traffic as the ledger's `rendezvous` object.
    pub fn counters(&self, round: i64) -> Json {
        let t = self.traffic.lock().expect("traffic lock");
        let b = t.get(&Some(round)).copied().unwrap_or([0; 4]);
        Json::obj()
            .with("messages_sent", b[0])
            .with("messages_received", b[1])
            .with("bytes_sent", b[2])
            .with("bytes_received", b[3])
    }

    pub fn send(&mut self, kind: &str, fields: Json) -> Result<(), EngineError> {
        let mut msg = Json::obj()
            .with("kind", kind)
            .with("epoch", self.epoch)
            .with("peer_epoch", self.peer_epoch);
        if let Json::Obj(items) = fields {
            for (k, v) in items {
                msg.set(&k, v);
            }
        }
        let text = msg.to_text();
        let mut frame = (text.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(text.as_bytes());
        self.stream
            .write_all(&frame)
            .map_err(|e| EngineError::new("PeerLost", "rendezvous", &format!("sending {kind}: {e}")))?;
        let mut t = self.traffic.lock().expect("traffic lock");
        let bucket = t.entry(round_of(&msg)).or_insert([0; 4]);
        bucket[0] += 1;
        bucket[2] += frame.len() as u64;
        Ok(())
    }

    /// The next message; its kind must be one of `expect`; epochs are checked.
    pub fn recv(&mut self, timeout: f64, expect: &[&str]) -> Result<Json, EngineError> {
        let msg = match self.inbox.recv_timeout(Duration::from_secs_f64(timeout)) {
            Ok(Ok(m)) => m,
            Ok(Err(reason)) => {
                return Err(EngineError::new(
                    "PeerLost",
                    "rendezvous",
                    &format!("peer closed the rendezvous connection ({reason})"),
                ))
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(EngineError::new(
                    "Timeout",
                    "rendezvous",
                    &format!("no {} within {timeout} s", expect.join("/")),
                ))
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(EngineError::new(
                    "PeerLost",
                    "rendezvous",
                    "the rendezvous reader ended",
                ))
            }
        };
        let kind = msg.get("kind").and_then(Json::as_str).unwrap_or_default().to_string();
        if kind == "ERROR" {
            let error = msg
                .get("error")
                .and_then(Json::as_str)
                .unwrap_or("ProtocolError")
                .to_string();
            let op = msg
                .get("operation")
                .and_then(Json::as_str)
                .unwrap_or("rendezvous")
                .to_string();
            let text = msg.get("message").map(Json::to_text).unwrap_or_default();
            return Err(EngineError::new(&error, &op, &format!("peer reported: {text}")));
        }
        if !expect.contains(&kind.as_str()) {
            return Err(EngineError::new(
                "ProtocolError",
                "rendezvous",
                &format!("expected {}, got '{kind}'", expect.join("/")),
            ));
        }
        let their_view = msg.get("peer_epoch").and_then(Json::as_int);
        if let Some(e) = their_view {
            if e != i128::from(self.epoch) {
                return Err(EngineError::new(
                    "EpochMismatch",
                    "open_segment",
                    &format!("peer addressed epoch {e}, this engine is epoch {}", self.epoch),
                ));
            }
        }
        if let Some(pe) = self.peer_epoch {
            let got = msg.get("epoch").and_then(Json::as_int);
            if got != Some(i128::from(pe)) {
                return Err(EngineError::new(
                    "EpochMismatch",
                    "open_segment",
                    &format!(
                        "peer epoch changed from {pe} to {}",
                        msg.get("epoch").map(Json::to_text).unwrap_or_default()
                    ),
                ));
            }
        }
        Ok(msg)
    }

    pub fn close(&mut self) {
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}
