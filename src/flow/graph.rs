//! The dependency graph of a flow's steps: step `i` needs the steps `needs[i]` (indices). Pure
//! functions, iterative (a flow may have many thousands of steps), linear in steps plus edges.

/// A cycle closed by one `needs` entry: `steps[0]` needs `steps[1]`, which needs `steps[2]`, ...,
/// and the last one needs `steps[0]` again through its entry number `entry`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cycle {
    pub(crate) steps: Vec<usize>,
    pub(crate) entry: usize,
}

/// The cycles a depth-first walk finds, starting from the steps in file order and following each
/// step's needs in the order written: one per entry that leads back to a step still being walked,
/// at most `limit` of them (each costs up to the number of steps). Empty when the graph is
/// acyclic. Entries pointing outside `needs` are ignored.
pub(crate) fn cycles<N: std::ops::Deref<Target = [usize]>>(needs: &[N], limit: usize) -> Vec<Cycle> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut mark = vec![Mark::New; needs.len()];
    // Position of each step on the current path, for cutting the cycle out of it.
    let mut at = vec![usize::MAX; needs.len()];
    let mut found = Vec::new();
    // The path being walked: (step, next entry of its needs to follow). Empty between walks.
    let mut path: Vec<(usize, usize)> = Vec::new();
    for start in 0..needs.len() {
        if mark[start] != Mark::New {
            continue;
        }
        path.push((start, 0));
        mark[start] = Mark::OnPath;
        at[start] = 0;
        while let Some(last) = path.last_mut() {
            let (step, entry) = *last;
            last.1 += 1;
            let Some(&target) = needs[step].get(entry) else {
                mark[step] = Mark::Done;
                path.pop();
                continue;
            };
            match mark.get(target) {
                Some(Mark::New) => {
                    mark[target] = Mark::OnPath;
                    at[target] = path.len();
                    path.push((target, 0));
                }
                Some(Mark::OnPath) => {
                    if found.len() == limit {
                        return found;
                    }
                    let steps = path[at[target]..].iter().map(|(s, _)| *s).collect();
                    found.push(Cycle { steps, entry });
                }
                Some(Mark::Done) | None => {}
            }
        }
    }
    found
}

/// How deep each step sits: 0 for a root, else one more than the deepest step it needs. `None`
/// when the graph has a cycle (or an entry outside it).
pub(crate) fn depths<N: std::ops::Deref<Target = [usize]>>(needs: &[N]) -> Option<Vec<usize>> {
    let n = needs.len();
    let mut waiting_on: Vec<usize> = needs.iter().map(|list| list.len()).collect();
    let mut dependents = vec![Vec::new(); n];
    for (step, list) in needs.iter().enumerate() {
        for &need in list.iter() {
            dependents.get_mut(need)?.push(step);
        }
    }
    let mut depth = vec![0; n];
    let mut ready: Vec<usize> = (0..n).filter(|&s| waiting_on[s] == 0).collect();
    let mut done = 0;
    while let Some(step) = ready.pop() {
        done += 1;
        for &d in &dependents[step] {
            depth[d] = depth[d].max(depth[step] + 1);
            waiting_on[d] -= 1;
            if waiting_on[d] == 0 {
                ready.push(d);
            }
        }
    }
    (done == n).then_some(depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acyclic_graph_has_no_cycles_and_depths_by_longest_chain() {
        // 0, 1 roots; 2 needs both; 3 needs 2 and 0.
        let needs = vec![vec![], vec![], vec![0, 1], vec![2, 0]];
        assert!(cycles(&needs, usize::MAX).is_empty());
        assert_eq!(depths(&needs), Some(vec![0, 0, 1, 2]));
    }

    #[test]
    fn a_cycle_is_cut_out_of_the_walk_and_closed_by_the_entry_that_leads_back() {
        // 0 needs 1, 1 needs 2, 2 needs (0: a root, then 1: closes 1 -> 2 -> 1).
        let needs = vec![vec![1], vec![2], vec![3, 1], vec![]];
        assert_eq!(cycles(&needs, usize::MAX), [Cycle { steps: vec![1, 2], entry: 1 }]);
        assert_eq!(depths(&needs), None);
        let two = vec![vec![1], vec![0]];
        let found = cycles(&two, usize::MAX);
        assert_eq!(found, [Cycle { steps: vec![0, 1], entry: 0 }], "closed by step 1's entry 0");
    }

    #[test]
    fn each_entry_closing_a_cycle_is_found_once() {
        let needs = vec![vec![0], vec![2], vec![1], vec![3]];
        assert_eq!(
            cycles(&needs, usize::MAX),
            [
                Cycle { steps: vec![0], entry: 0 },
                Cycle { steps: vec![1, 2], entry: 0 },
                Cycle { steps: vec![3], entry: 0 }
            ]
        );
    }

    #[test]
    fn long_chains_need_no_recursion() {
        let n = 200_000;
        let mut needs: Vec<Vec<usize>> = (0..n).map(|i| if i == 0 { vec![] } else { vec![i - 1] }).collect();
        assert!(cycles(&needs, usize::MAX).is_empty());
        assert_eq!(depths(&needs).map(|d| d[n - 1]), Some(n - 1));
        needs[0] = vec![n - 1];
        assert_eq!(cycles(&needs, usize::MAX).len(), 1);
        assert_eq!(cycles(&needs, usize::MAX)[0].steps.len(), n);
    }

    #[test]
    fn the_walk_stops_at_the_limit() {
        // Every step needs the next and the first: each closes a cycle as long as the walk so far.
        let n = 100_000;
        let needs: Vec<Vec<usize>> = (0..n).map(|i| if i + 1 < n { vec![i + 1, 0] } else { vec![0] }).collect();
        let found = cycles(&needs, 3);
        assert_eq!(found.len(), 3);
        assert_eq!(found[0].steps.len(), n);
        assert!(cycles(&needs, 0).is_empty());
    }

    #[test]
    fn entries_outside_the_graph_are_not_followed() {
        assert!(cycles(&[vec![7]], usize::MAX).is_empty());
        assert_eq!(depths(&[vec![7]]), None);
    }
}
