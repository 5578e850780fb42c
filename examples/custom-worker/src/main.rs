//! A worker binary with its own components: a spout counting 1, 2, 3, ... and a FizzBuzz bolt,
//! registered next to Squall's built-ins. Supervisors launch it as `<binary> worker --flags..`
//! when it is submitted with `squall submit --worker-binary`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde::Deserialize;
use worker::cli::WorkerCommand;
use worker::flux::parse_params;
use worker::{
    Bolt, BoltCollector, ComponentError, Fields, OutputDeclarer, Registry, Spout, SpoutCollector,
    TopologyContext, Tuple, Value,
};

#[derive(Parser)]
#[command(name = "custom-worker", about = "Squall worker with the fizzbuzz components")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one worker (what the supervisor launches).
    Worker(WorkerCommand),
}

/// `counting-spout` params.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct CountingParams {
    /// Numbers per second per task; unlimited when absent.
    rate_per_sec: Option<f64>,
}

/// Emits 1, 2, 3, ... on field `n`, reliably (the number is the message id); failed numbers
/// are emitted again.
struct CountingSpout {
    params: CountingParams,
    next: u64,
    replay: Vec<u64>,
    last: Option<Instant>,
}

impl Spout for CountingSpout {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["n"]));
    }

    fn open(&mut self, _context: &TopologyContext) -> Result<(), ComponentError> {
        self.next = 1;
        Ok(())
    }

    fn next_tuple(&mut self, out: &mut SpoutCollector<'_>) -> Result<(), ComponentError> {
        if let Some(rate) = self.params.rate_per_sec {
            let gap = Duration::from_secs_f64(1.0 / rate.max(0.001));
            if self.last.is_some_and(|l| l.elapsed() < gap) {
                return Ok(());
            }
            self.last = Some(Instant::now());
        }
        let n = self.replay.pop().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        });
        out.emit([Value::Int(n as i64)], Some(n))?;
        Ok(())
    }

    fn fail(&mut self, msg_id: u64) {
        self.replay.push(msg_id);
    }
}

/// FizzBuzz of field `n`: emits `(n, "Fizz" | "Buzz" | "FizzBuzz" | n)`, anchored.
struct FizzBuzz;

impl Bolt for FizzBuzz {
    fn declare_outputs(&self, declarer: &mut OutputDeclarer) {
        declarer.declare(Fields::new(["n", "says"]));
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let n = input.get_int(0).ok_or("field n is not an integer")?;
        let says = match (n % 3, n % 5) {
            (0, 0) => "FizzBuzz".to_owned(),
            (0, _) => "Fizz".to_owned(),
            (_, 0) => "Buzz".to_owned(),
            _ => n.to_string(),
        };
        out.emit(&[input], worker::values![n, says])?;
        out.ack(input);
        Ok(())
    }
}

/// The built-ins plus this crate's components.
fn registry() -> Registry {
    let mut registry = Registry::with_builtins();
    registry.register_spout("counting-spout", |p| {
        let params: CountingParams = parse_params(p)?;
        Ok(Arc::new(move || {
            Box::new(CountingSpout { params: params.clone(), next: 1, replay: Vec::new(), last: None })
                as Box<dyn Spout>
        }))
    });
    registry.register_bolt("fizzbuzz", |p| {
        if !p.is_null() {
            return Err("takes no params".into());
        }
        Ok(Arc::new(|| Box::new(FizzBuzz) as Box<dyn Bolt>))
    });
    registry
}

fn main() {
    let Command::Worker(cmd) = Cli::parse().command;
    let metrics = prometheus::Registry::new();
    if let Err(e) = worker::cli::execute(cmd, &registry(), &metrics) {
        eprintln!("custom-worker: {e}");
        std::process::exit(1);
    }
}
