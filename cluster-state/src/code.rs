//! The files a topology's code consists of, under `<storm.local.dir>/stormdist/<topology-id>/`
//! on nimbus (where it is uploaded) and on every supervisor (where it is downloaded to), and
//! their names in nimbus's HTTP API. A closed set, so a file name from a request is matched,
//! never used as a path.

use std::fmt;
use std::str::FromStr;

use crate::ids::IdError;

/// One file of a topology's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CodeFile {
    /// The topology definition (Flux YAML), Storm's `stormcode.ser`.
    Topology,
    /// The user's worker binary, Storm's `stormjar.jar`; optional (the `squall` binary's
    /// built-in components run topologies without one).
    WorkerBinary,
    /// 32 random bytes nimbus creates at submit, with which the topology's workers
    /// authenticate each other (mode 0600 wherever it is stored; never in ZooKeeper, which
    /// anonymous clients can read).
    Secret,
    /// The files of the topology's shell components (scripts, requirement lists, data), a tar
    /// archive (`crate::resources`), Storm's `resources/` in the jar; optional. Supervisors
    /// unpack it to `resources/` beside it, the shell components' working directory.
    Resources,
}

impl CodeFile {
    /// Every code file.
    pub const ALL: [CodeFile; 4] =
        [CodeFile::Topology, CodeFile::WorkerBinary, CodeFile::Secret, CodeFile::Resources];

    /// Whether a topology may lack this file: its own worker binary and resources are
    /// optional, and topologies submitted before secrets existed have none.
    pub fn is_optional(self) -> bool {
        !matches!(self, CodeFile::Topology)
    }

    /// The file name under `stormdist/<topology-id>/`, also its name in the HTTP API.
    pub fn file_name(self) -> &'static str {
        match self {
            CodeFile::Topology => "topology.yaml",
            CodeFile::WorkerBinary => "worker",
            CodeFile::Secret => "topology.secret",
            CodeFile::Resources => "resources.tar",
        }
    }
}

impl fmt::Display for CodeFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file_name())
    }
}

impl FromStr for CodeFile {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        CodeFile::ALL.into_iter().find(|f| f.file_name() == s).ok_or_else(|| IdError {
            kind: "code file",
            value: s.chars().take(80).collect(),
            rule: "must be one of topology.yaml, worker, topology.secret, resources.tar",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        for file in CodeFile::ALL {
            assert_eq!(file.file_name().parse::<CodeFile>().unwrap(), file);
        }
        for bad in ["", "../worker", "worker/", "Topology.yaml", "stormjar.jar", "topology.yaml\0"] {
            assert!(bad.parse::<CodeFile>().is_err(), "{bad:?}");
        }
    }
}
