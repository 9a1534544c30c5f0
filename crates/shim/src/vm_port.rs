//! The host's end of a microVM guest's ports (`bazaar_vminit::Request`): `vm-signal SOCKET
//! SIG` writes a signal for the workload on the control port (the shim runs it for each
//! signal it forwards: `ShimSpec::signal_argv`), `vm-exec SOCKET ARGV...` runs a command in
//! the guest over the exec port and exits as the command did, its output on ours. Each
//! socket is QEMU's end of the port, which takes one connection at a time.

use bazaar_vminit::{ExecReply, Request};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// The body of `vm-signal SOCKET SIG` and `vm-exec SOCKET ARGV...`.
pub fn port_main(command: &str, socket: &Path, args: &[String]) -> ! {
    let result = match command {
        "vm-signal" => args
            .first()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| "vm-signal SOCKET SIG: a signal number".to_string())
            .and_then(|sig| send(socket, &Request::Signal(sig)).map(|_| 0)),
        _ => exec(socket, args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("{command}: {}: {e}", socket.display());
            std::process::exit(125)
        }
    }
}

fn send(socket: &Path, req: &Request) -> Result<UnixStream, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| e.to_string())?;
    stream
        .write_all(req.line().as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(stream)
}

fn exec(socket: &Path, argv: &[String]) -> Result<i32, String> {
    if argv.is_empty() {
        return Err("vm-exec SOCKET ARGV...: a command".into());
    }
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let stream = send(
        socket,
        &Request::Exec {
            nonce,
            argv: argv.to_vec(),
        },
    )?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
            return Err("the guest closed the exec port".into());
        }
        // A reply to a client that gave up before it came is skipped.
        if let Some(reply) = ExecReply::parse(&line).filter(|r| r.nonce == nonce) {
            let _ = std::io::stdout().write_all(&reply.stdout);
            let _ = std::io::stderr().write_all(&reply.stderr);
            return Ok(reply.code);
        }
    }
}
