//! The topology state machine, as a pure function over the stored [`StormBase`].
//!
//! Storm's nimbus keeps its delayed transitions (`kill -w`, `rebalance -w`) in memory, so a
//! nimbus restart forgets them and a killed topology lingers. Here every delayed transition is
//! part of the base record in ZooKeeper: the caller writes the returned base, arms a timer for
//! `pending_transition.deadline_secs`, and on a restart re-arms it from what it reads back
//! ([`Event::Deadline`] fires at once for a deadline already past).
//!
//! | status \ event | activate | deactivate | rebalance -w | kill -w | deadline |
//! |---|---|---|---|---|---|
//! | active | unchanged | inactive | rebalancing | killed | - |
//! | inactive | active | unchanged | rebalancing | killed | - |
//! | rebalancing | refused | refused | refused | killed | reschedule, back to previous status |
//! | killed | refused | refused | refused | killed, new deadline | remove |

use std::collections::BTreeMap;

use cluster_state::ids::ComponentId;
use cluster_state::znode::{DelayedTransition, StormBase, TopologyStatus};

/// What an operator (or the timer) asks of a topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Let spouts emit.
    Activate,
    /// Pause spouts.
    Deactivate,
    /// After `wait_secs` with spouts paused, reschedule with the new settings.
    Rebalance { wait_secs: u64, num_workers: Option<u32>, component_executors: BTreeMap<ComponentId, u32> },
    /// After `wait_secs` with spouts paused (so in-flight tuples can finish), remove it.
    Kill { wait_secs: u64 },
    /// The pending transition's deadline may have passed.
    Deadline,
}

impl Event {
    /// The event's name, as operators type it (`kill`, `rebalance`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Event::Activate => "activate",
            Event::Deactivate => "deactivate",
            Event::Rebalance { .. } => "rebalance",
            Event::Kill { .. } => "kill",
            Event::Deadline => "deadline",
        }
    }
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing changes.
    Unchanged,
    /// Write this base record (and arm a timer for its pending transition, if any).
    Update(StormBase),
    /// Reschedule every executor now with the settings of this base, then write it.
    Reschedule(StormBase),
    /// Remove the topology: its znodes and its code.
    Remove,
}

/// An event the topology's state does not allow, or a bad rebalance request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// Storm's "No transition for event".
    #[error("topology {name} is {status}: it cannot {event} now")]
    NoTransition { name: String, status: TopologyStatus, event: &'static str },
    /// `rebalance -e` named a component the topology does not have.
    #[error("topology {name} has no component {component}; its components are {known:?}")]
    UnknownComponent { name: String, component: ComponentId, known: Vec<ComponentId> },
    /// A worker count or parallelism of zero.
    #[error("{what} must be at least 1")]
    Zero { what: String },
}

/// Applies `event` to the topology whose base record is `base`, at `now_secs`.
pub fn transition(base: &StormBase, event: Event, now_secs: u64) -> Result<Outcome, LifecycleError> {
    use TopologyStatus::*;
    let refuse = |event: &Event| LifecycleError::NoTransition {
        name: base.name.to_string(),
        status: base.status,
        event: event.name(),
    };
    let with = |status, prev_status, pending_transition| StormBase {
        status,
        prev_status,
        pending_transition,
        ..base.clone()
    };
    Ok(match (base.status, event) {
        (Active, Event::Activate) | (Inactive, Event::Deactivate) => Outcome::Unchanged,
        (Inactive, Event::Activate) => Outcome::Update(with(Active, None, None)),
        (Active, Event::Deactivate) => Outcome::Update(with(Inactive, None, None)),
        (Active | Inactive, Event::Rebalance { wait_secs, num_workers, component_executors }) => {
            validate_rebalance(base, num_workers, &component_executors)?;
            let pending = DelayedTransition::Rebalance {
                deadline_secs: now_secs.saturating_add(wait_secs),
                num_workers,
                component_executors,
            };
            Outcome::Update(with(Rebalancing, Some(base.status), Some(pending)))
        }
        (_, Event::Kill { wait_secs }) => {
            let pending = DelayedTransition::Kill { deadline_secs: now_secs.saturating_add(wait_secs) };
            Outcome::Update(with(Killed, None, Some(pending)))
        }
        (_, Event::Deadline) => match &base.pending_transition {
            Some(pending) if pending.deadline_secs() > now_secs => Outcome::Unchanged,
            Some(DelayedTransition::Kill { .. }) => Outcome::Remove,
            Some(DelayedTransition::Rebalance { num_workers, component_executors, .. }) => {
                let mut rebalanced = with(base.prev_status.unwrap_or(Active), None, None);
                if let Some(n) = num_workers {
                    rebalanced.num_workers = *n;
                }
                rebalanced.component_executors.extend(component_executors.clone());
                Outcome::Reschedule(rebalanced)
            }
            None => Outcome::Unchanged,
        },
        (Rebalancing | Killed, event) => return Err(refuse(&event)),
    })
}

fn validate_rebalance(
    base: &StormBase,
    num_workers: Option<u32>,
    component_executors: &BTreeMap<ComponentId, u32>,
) -> Result<(), LifecycleError> {
    if num_workers == Some(0) {
        return Err(LifecycleError::Zero { what: "the number of workers (-n)".into() });
    }
    for (component, &parallelism) in component_executors {
        if !base.component_executors.contains_key(component) {
            return Err(LifecycleError::UnknownComponent {
                name: base.name.to_string(),
                component: component.clone(),
                known: base.component_executors.keys().cloned().collect(),
            });
        }
        if parallelism == 0 {
            return Err(LifecycleError::Zero { what: format!("the parallelism of {component} (-e)") });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use TopologyStatus::*;
    use cluster_state::ids::TopologyName;

    const NOW: u64 = 1_700_000_000;

    fn comp(id: &str) -> ComponentId {
        ComponentId::new(id).unwrap()
    }

    fn base(status: TopologyStatus) -> StormBase {
        StormBase {
            name: TopologyName::new("wc").unwrap(),
            launch_time_secs: NOW - 100,
            status,
            num_workers: 2,
            component_executors: [(comp("split"), 2), (comp("count"), 4)].into_iter().collect(),
            owner: "alice".into(),
            prev_status: None,
            pending_transition: None,
        }
    }

    fn rebalance(wait_secs: u64) -> Event {
        Event::Rebalance {
            wait_secs,
            num_workers: Some(3),
            component_executors: [(comp("split"), 6)].into_iter().collect(),
        }
    }

    fn status_after(from: TopologyStatus, event: Event) -> Result<Option<TopologyStatus>, LifecycleError> {
        transition(&base(from), event, NOW).map(|outcome| match outcome {
            Outcome::Update(b) | Outcome::Reschedule(b) => Some(b.status),
            Outcome::Unchanged | Outcome::Remove => None,
        })
    }

    #[test]
    fn the_transition_table() {
        let table: [(TopologyStatus, Event, Option<TopologyStatus>); 8] = [
            (Active, Event::Activate, None),
            (Active, Event::Deactivate, Some(Inactive)),
            (Active, rebalance(10), Some(Rebalancing)),
            (Active, Event::Kill { wait_secs: 30 }, Some(Killed)),
            (Inactive, Event::Activate, Some(Active)),
            (Inactive, Event::Deactivate, None),
            (Inactive, rebalance(10), Some(Rebalancing)),
            (Rebalancing, Event::Kill { wait_secs: 0 }, Some(Killed)),
        ];
        for (from, event, expected) in table {
            assert_eq!(status_after(from, event.clone()).unwrap(), expected, "{from} + {event:?}");
        }
        for (from, event) in [
            (Rebalancing, Event::Activate),
            (Rebalancing, Event::Deactivate),
            (Rebalancing, rebalance(0)),
            (Killed, Event::Activate),
            (Killed, Event::Deactivate),
            (Killed, rebalance(0)),
        ] {
            let err = status_after(from, event.clone()).unwrap_err();
            assert!(matches!(err, LifecycleError::NoTransition { status, .. } if status == from), "{err}");
            assert!(err.to_string().starts_with(&format!("topology wc is {from}: it cannot")), "{err}");
        }
    }

    #[test]
    fn kill_is_stored_with_its_deadline_and_removes_once_due() {
        let Outcome::Update(killed) = transition(&base(Active), Event::Kill { wait_secs: 30 }, NOW).unwrap()
        else {
            panic!("kill updates the base")
        };
        assert_eq!(killed.pending_transition, Some(DelayedTransition::Kill { deadline_secs: NOW + 30 }));
        // A restarted nimbus re-arms from the stored base: not yet due, then due.
        assert_eq!(transition(&killed, Event::Deadline, NOW + 29).unwrap(), Outcome::Unchanged);
        assert_eq!(transition(&killed, Event::Deadline, NOW + 30).unwrap(), Outcome::Remove);
        assert_eq!(transition(&killed, Event::Deadline, NOW + 9999).unwrap(), Outcome::Remove);
        // `kill -w 0` on a slow kill brings the removal forward.
        let Outcome::Update(sooner) = transition(&killed, Event::Kill { wait_secs: 0 }, NOW + 1).unwrap()
        else {
            panic!("kill updates the base")
        };
        assert_eq!(sooner.pending_transition, Some(DelayedTransition::Kill { deadline_secs: NOW + 1 }));
    }

    #[test]
    fn rebalance_returns_to_the_previous_status_with_new_settings() {
        let Outcome::Update(waiting) = transition(&base(Inactive), rebalance(10), NOW).unwrap() else {
            panic!("rebalance updates the base")
        };
        assert_eq!((waiting.status, waiting.prev_status), (Rebalancing, Some(Inactive)));
        assert_eq!(transition(&waiting, Event::Deadline, NOW + 9).unwrap(), Outcome::Unchanged);
        let Outcome::Reschedule(done) = transition(&waiting, Event::Deadline, NOW + 10).unwrap() else {
            panic!("a due rebalance reschedules")
        };
        assert_eq!(done.status, Inactive);
        assert_eq!((done.prev_status, done.pending_transition.clone()), (None, None));
        assert_eq!(done.num_workers, 3);
        assert_eq!(done.component_executors[&comp("split")], 6);
        assert_eq!(done.component_executors[&comp("count")], 4, "unnamed components keep theirs");
    }

    #[test]
    fn bad_rebalance_requests_name_what_is_wrong() {
        let unknown = Event::Rebalance {
            wait_secs: 0,
            num_workers: None,
            component_executors: [(comp("nope"), 2)].into_iter().collect(),
        };
        let err = transition(&base(Active), unknown, NOW).unwrap_err();
        assert!(err.to_string().contains("no component nope"), "{err}");
        let zero = Event::Rebalance {
            wait_secs: 0,
            num_workers: None,
            component_executors: [(comp("split"), 0)].into_iter().collect(),
        };
        assert!(transition(&base(Active), zero, NOW).unwrap_err().to_string().contains("split"));
        let no_workers =
            Event::Rebalance { wait_secs: 0, num_workers: Some(0), component_executors: BTreeMap::new() };
        assert!(matches!(transition(&base(Active), no_workers, NOW), Err(LifecycleError::Zero { .. })));
    }

    #[test]
    fn deadline_without_pending_transition_changes_nothing() {
        assert_eq!(transition(&base(Active), Event::Deadline, NOW).unwrap(), Outcome::Unchanged);
    }
}
