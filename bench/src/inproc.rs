//! `inproc`: the bench program with no transport at all. Each call is
//! encoded with the bench client encoder, dispatched by the dataplane's
//! [`ServiceTable`] on the caller's thread into a per-slot reply buffer,
//! and decoded by [`drive`](crate::driver::drive) like any other reply.
//!
//! It is the software floor of an RPC on this machine (XDR encode,
//! dispatch, the service, decode, one copy of the data each way), next to
//! the physical floor of `floor`, and the reference implementation of
//! [`RpcDriver`]: everything is allocated in [`prepare`](RpcDriver::prepare),
//! nothing per call. The server's work runs on the client's thread, so its
//! CPU time is inside the client's and `server_cpu` is `None`.

use dataplane::service::bench::{encode_call, Args};
use dataplane::service::{Dispatch, ServiceTable};

use crate::driver::{Reply, RpcDriver};
use crate::spec::{BenchError, RunSpec};
use crate::tirpc::CpuTimes;

/// Room for the RPC headers around the data in each buffer.
const HEADER_ROOM: usize = 512;

/// The in-process driver.
pub struct InProc {
    table: ServiceTable,
    xid: u32,
    calls: Vec<Vec<u8>>,
    replies: Vec<Vec<u8>>,
    reply_len: Vec<usize>,
    ready: Vec<u32>,
}

impl InProc {
    /// A driver over the built-in service table.
    pub fn new() -> InProc {
        InProc {
            table: ServiceTable::builtin(),
            xid: 0,
            calls: Vec::new(),
            replies: Vec::new(),
            reply_len: Vec::new(),
            ready: Vec::new(),
        }
    }
}

impl Default for InProc {
    fn default() -> Self {
        InProc::new()
    }
}

impl RpcDriver for InProc {
    fn name(&self) -> &'static str {
        "inproc"
    }

    fn describe(&self) -> String {
        "inproc: the bench service called on the client's thread, no transport".to_owned()
    }

    fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError> {
        let depth = spec.depth.max(1) as usize;
        let len = spec.size as usize + HEADER_ROOM;
        self.calls = vec![vec![0u8; len]; depth];
        self.replies = vec![vec![0u8; len]; depth];
        self.reply_len = vec![0; depth];
        self.ready = Vec::with_capacity(depth);
        Ok(())
    }

    fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError> {
        let s = slot as usize;
        let fail = |reason: String| BenchError::Call {
            transport: "inproc",
            reason,
        };
        let (call, reply) = match (self.calls.get_mut(s), self.replies.get_mut(s)) {
            (Some(c), Some(r)) => (c, r),
            _ => return Err(fail(format!("slot {slot} beyond the prepared depth"))),
        };
        self.xid = self.xid.wrapping_add(1);
        let encoded = encode_call(call, self.xid, args).map_err(|e| fail(e.to_string()))?;
        match self.table.dispatch(&call[..encoded.len], reply) {
            Dispatch::Reply { len, .. } => {
                self.reply_len[s] = len;
                self.ready.push(slot);
                Ok(())
            }
            Dispatch::Drop => Err(fail("the service table dropped the call".to_owned())),
        }
    }

    fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, mut done: F) -> Result<usize, BenchError> {
        let n = self.ready.len();
        for &slot in &self.ready {
            let s = slot as usize;
            done(
                slot,
                Reply {
                    message: &self.replies[s][..self.reply_len[s]],
                    ddp: None,
                },
            );
        }
        self.ready.clear();
        Ok(n)
    }

    fn server_cpu(&self) -> Option<CpuTimes> {
        None
    }
}

/// The generic loop ([`drive`](crate::driver::drive)) run over this
/// driver. Here rather than in `driver`, which sits below this module.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::driver::drive;
    use crate::spec::Op;

    /// The in-process driver with its replies passed through `mangle`.
    struct Mangled<M> {
        inner: InProc,
        mangle: M,
        buf: Vec<u8>,
        seen: u64,
    }

    impl<M: FnMut(u64, &mut Vec<u8>)> RpcDriver for Mangled<M> {
        fn name(&self) -> &'static str {
            "mangled"
        }
        fn describe(&self) -> String {
            "inproc with altered replies".to_owned()
        }
        fn prepare(&mut self, spec: &RunSpec) -> Result<(), BenchError> {
            self.inner.prepare(spec)
        }
        fn start(&mut self, slot: u32, args: Args<'_>) -> Result<(), BenchError> {
            self.inner.start(slot, args)
        }
        fn poll<F: FnMut(u32, Reply<'_>)>(&mut self, mut done: F) -> Result<usize, BenchError> {
            let mut finished = Vec::new();
            self.inner
                .poll(|slot, r| finished.push((slot, r.message.to_vec())))?;
            for (slot, message) in &finished {
                self.buf.clone_from(message);
                (self.mangle)(self.seen, &mut self.buf);
                self.seen += 1;
                done(
                    *slot,
                    Reply {
                        message: &self.buf,
                        ddp: None,
                    },
                );
            }
            Ok(finished.len())
        }
        fn server_cpu(&self) -> Option<CpuTimes> {
            None
        }
    }

    fn spec(op: Op, size: u32, depth: u32) -> RunSpec {
        let mut s = RunSpec::new(op, size, depth, Duration::from_millis(20));
        s.check = true;
        s.warmup_calls = 1;
        s
    }

    #[test]
    fn inproc_runs_every_op_and_counts_what_it_measured() {
        let mut d = InProc::new();
        for (op, size, depth) in [
            (Op::Null, 0, 1),
            (Op::Echo, 100, 2),
            (Op::Read, 4097, 8),
            (Op::Write, 65536, 3),
        ] {
            let r = drive(&mut d, &spec(op, size, depth)).unwrap();
            assert_eq!((r.op, r.size, r.depth), (op, size, depth));
            assert!(r.calls > 0 && r.seconds > 0.0);
            assert_eq!(r.latency.count, r.calls);
            assert_eq!(r.bytes, r.calls * u64::from(size));
            assert!(r.server_cpu.is_none());
            match op {
                Op::Echo | Op::Read => assert!(r.check.unwrap().ok),
                Op::Null | Op::Write => assert!(r.check.is_none()),
            }
        }
    }

    #[test]
    fn a_changed_data_byte_fails_the_check() {
        // Every third reply has its last data byte flipped.
        let mut d = Mangled {
            inner: InProc::new(),
            mangle: |n: u64, m: &mut Vec<u8>| {
                if n % 3 == 2 {
                    if let Some(b) = m.last_mut() {
                        *b ^= 0x40;
                    }
                }
            },
            buf: Vec::new(),
            seen: 0,
        };
        let r = drive(&mut d, &spec(Op::Read, 4096, 2)).unwrap();
        let c = r.check.unwrap();
        assert!(c.differing > 0 || c.first_fnv1a64 != c.expected_fnv1a64);
        assert!(!c.ok);
    }

    #[test]
    fn a_malformed_reply_fails_the_run() {
        let mut d = Mangled {
            inner: InProc::new(),
            mangle: |_: u64, m: &mut Vec<u8>| m.truncate(m.len() / 2),
            buf: Vec::new(),
            seen: 0,
        };
        let err = drive(&mut d, &spec(Op::Read, 4096, 1)).unwrap_err();
        assert!(matches!(err, BenchError::Call { .. }), "{err}");
        let mut d = Mangled {
            inner: InProc::new(),
            mangle: |_: u64, m: &mut Vec<u8>| m.push(0),
            buf: Vec::new(),
            seen: 0,
        };
        assert!(drive(&mut d, &spec(Op::Null, 0, 1)).is_err());
    }
}
