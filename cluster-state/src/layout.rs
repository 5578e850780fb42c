//! Task ids and executors as Storm assigns them: a pure function of each component's
//! `(parallelism, tasks)`, shared by nimbus (which assigns executors to slots) and workers (which
//! run them), so both always agree.
//!
//! Storm numbers tasks from 1 over the components sorted by id (ackers included as
//! `__acker`), each component getting a consecutive range; a component's tasks are split into
//! its executors with `partition-fixed` (earlier executors take the remainder).

use std::collections::BTreeMap;

use crate::ids::{ComponentId, ExecutorId, TaskId};

/// Splits `items` into `parts` consecutive chunks whose sizes differ by at most one, larger
/// chunks first (Storm's `partition-fixed`). Fewer chunks when there are fewer items.
pub fn partition_fixed<T: Clone>(parts: usize, items: &[T]) -> Vec<Vec<T>> {
    if parts == 0 || items.is_empty() {
        return Vec::new();
    }
    let parts = parts.min(items.len());
    let base = items.len() / parts;
    let extra = items.len() % parts;
    let mut out = Vec::with_capacity(parts);
    let mut at = 0;
    for i in 0..parts {
        let len = base + usize::from(i < extra);
        out.push(items[at..at + len].to_vec());
        at += len;
    }
    out
}

/// Every task and executor of a topology.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskLayout {
    /// Component of each task.
    pub task_component: BTreeMap<TaskId, ComponentId>,
    /// Tasks of each component, ascending.
    pub component_tasks: BTreeMap<ComponentId, Vec<TaskId>>,
    /// Executors with their component, ascending.
    pub executors: BTreeMap<ExecutorId, ComponentId>,
}

impl TaskLayout {
    /// Storm's numbering for `(component, parallelism, tasks)` triples (any order).
    ///
    /// Task ids are `u32`: a component whose tasks would not all get an id (more than
    /// `u32::MAX` tasks in all) is left out, never numbered with wrapped ids. Nimbus refuses
    /// such topologies at submit ([`crate::structure::TopologyStructure::from_flux`]).
    pub fn compute(components: &[(ComponentId, u32, u32)]) -> TaskLayout {
        let mut sorted: Vec<&(ComponentId, u32, u32)> = components.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut layout = TaskLayout::default();
        let mut next = 1u32;
        for (component, parallelism, tasks) in sorted {
            // `next + tasks` is one past this component's last id, which must itself fit.
            let Some(end) = next.checked_add(*tasks) else {
                tracing::error!(%component, tasks, "task ids run past u32::MAX; component left out");
                break;
            };
            let ids: Vec<TaskId> = (next..end).map(TaskId).collect();
            next = end;
            for t in &ids {
                layout.task_component.insert(*t, component.clone());
            }
            for chunk in partition_fixed(*parallelism as usize, &ids) {
                if let (Some(first), Some(last)) = (chunk.first(), chunk.last())
                    && let Ok(e) = ExecutorId::new(*first, *last)
                {
                    layout.executors.insert(e, component.clone());
                }
            }
            layout.component_tasks.insert(component.clone(), ids);
        }
        layout
    }

    /// The same tasks, split into `executors` instead (an assignment's executors, which follow a
    /// rebalance's `-e comp=N` while the topology file keeps its own parallelism). Every
    /// executor must cover tasks of one component; the first that does not is returned.
    pub fn with_executors(
        &self,
        executors: impl IntoIterator<Item = ExecutorId>,
    ) -> Result<TaskLayout, ExecutorId> {
        let mut out = TaskLayout {
            task_component: self.task_component.clone(),
            component_tasks: self.component_tasks.clone(),
            executors: BTreeMap::new(),
        };
        for executor in executors {
            let component = self.task_component.get(&executor.start_task()).ok_or(executor)?;
            if executor.tasks().any(|t| self.task_component.get(&t) != Some(component)) {
                return Err(executor);
            }
            out.executors.insert(executor, component.clone());
        }
        Ok(out)
    }

    /// The highest task id (0 for an empty topology).
    pub fn max_task(&self) -> u32 {
        self.task_component.keys().next_back().map_or(0, |t| t.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> ComponentId {
        ComponentId::new(s).unwrap()
    }

    #[test]
    fn partition_fixed_table() {
        let cases: &[(usize, usize, &[usize])] = &[
            (1, 5, &[5]),
            (2, 5, &[3, 2]),
            (3, 5, &[2, 2, 1]),
            (5, 5, &[1, 1, 1, 1, 1]),
            (7, 3, &[1, 1, 1]),
            (0, 3, &[]),
            (3, 0, &[]),
        ];
        for (parts, n, sizes) in cases {
            let items: Vec<usize> = (0..*n).collect();
            let got: Vec<usize> = partition_fixed(*parts, &items).iter().map(Vec::len).collect();
            assert_eq!(&got, sizes, "parts {parts} items {n}");
        }
    }

    #[test]
    fn tasks_are_numbered_over_sorted_components_with_ackers() {
        // Storm: word-count with spout(1), split(2, 4 tasks), count(3), and 1 acker.
        let layout = TaskLayout::compute(&[
            (c("split"), 2, 4),
            (c("spout"), 1, 1),
            (c("count"), 3, 3),
            (c("__acker"), 1, 1),
        ]);
        // Sorted: __acker, count, split, spout.
        let tasks = |name: &str| layout.component_tasks[&c(name)].iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(tasks("__acker"), vec![1]);
        assert_eq!(tasks("count"), vec![2, 3, 4]);
        assert_eq!(tasks("split"), vec![5, 6, 7, 8]);
        assert_eq!(tasks("spout"), vec![9]);
        let execs: Vec<(u32, u32, String)> = layout
            .executors
            .iter()
            .map(|(e, comp)| (e.start_task().0, e.end_task().0, comp.to_string()))
            .collect();
        assert_eq!(
            execs,
            vec![
                (1, 1, "__acker".into()),
                (2, 2, "count".into()),
                (3, 3, "count".into()),
                (4, 4, "count".into()),
                (5, 6, "split".into()),
                (7, 8, "split".into()),
                (9, 9, "spout".into()),
            ]
        );
        assert_eq!(layout.max_task(), 9);
    }

    #[test]
    fn task_ids_never_wrap() {
        // "a" takes id 1; "b"'s u32::MAX tasks would need ids past u32::MAX (Storm's numbering
        // wrapped them, and the bolt silently got no task).
        let layout = TaskLayout::compute(&[(c("b"), 1, u32::MAX), (c("a"), 1, 1)]);
        assert!(!layout.component_tasks.contains_key(&c("b")), "b must not get wrapped ids");
        assert_eq!((layout.max_task(), layout.executors.len()), (1, 1));
    }

    #[test]
    fn executors_from_an_assignment_replace_the_files() {
        let layout = TaskLayout::compute(&[(c("split"), 1, 4), (c("spout"), 1, 1)]);
        let ex = |a: u32, b: u32| ExecutorId::new(TaskId(a), TaskId(b)).unwrap();
        let split_in_two = layout.with_executors([ex(1, 2), ex(3, 4), ex(5, 5)]).unwrap();
        assert_eq!(split_in_two.executors.len(), 3);
        assert_eq!(split_in_two.executors[&ex(3, 4)].as_str(), "split");
        assert_eq!(layout.with_executors([ex(4, 5)]).unwrap_err(), ex(4, 5));
        assert_eq!(layout.with_executors([ex(6, 6)]).unwrap_err(), ex(6, 6));
    }
}
