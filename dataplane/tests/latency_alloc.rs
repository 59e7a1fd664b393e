//! Recording a call's latency allocates nothing: the worker's timed
//! dispatcher around the bench program, measured with a counting global
//! allocator, over NULL, ECHO, SOURCE and SINK calls.

mod support;

use std::sync::Arc;

use dataplane::service::bench::{self, Args};
use dataplane::service::latency::{LatencyTable, Timed};
use dataplane::service::{Dispatch, Dispatcher, ServiceTable};
use support::alloc_counter::{measure, CountingAllocator};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

#[test]
fn timed_dispatch_records_every_call_and_allocates_nothing() {
    let table: Arc<dyn Dispatcher> = Arc::new(ServiceTable::builtin());
    let latency = Arc::new(LatencyTable::new(&table.programs()));
    let timed = Timed::new(table, Arc::clone(&latency));
    let data = vec![7u8; 3000];
    let calls: Vec<Vec<u8>> = [
        Args::Null,
        Args::Echo(&data),
        Args::Source(2000),
        Args::Sink(&data),
    ]
    .iter()
    .enumerate()
    .map(|(i, args)| {
        let mut buf = vec![0u8; 8192];
        let n = bench::encode_call(&mut buf, i as u32 + 1, *args)
            .unwrap()
            .len;
        buf.truncate(n);
        buf
    })
    .collect();
    let mut reply = vec![0u8; 8192];
    const ROUNDS: u64 = 1000;
    let ((), allocated) = measure(|| {
        for _ in 0..ROUNDS {
            for call in &calls {
                let d = timed.dispatch(call, &mut reply);
                assert!(matches!(d, Dispatch::Reply { .. }));
            }
        }
    });
    assert_eq!(allocated.count, 0, "recording allocated: {allocated:?}");
    let samples = latency.samples();
    assert_eq!(samples.len(), 4, "{samples:?}");
    for s in &samples {
        assert_eq!((s.program, s.version), (bench::PROGRAM, bench::VERSION));
        assert_eq!(s.buckets.iter().sum::<u64>(), ROUNDS, "{s:?}");
    }
}
