//! Restarting lost ranks of a serving world (`launch -- serve`, `serve --ranks N`).
//!
//! A server outlives its ranks: when a rank other than 0 dies (killed, out of
//! memory, a host rebooted), the supervisor starts it again from the same
//! recipe (command line, environment, secret), after a short pause, and rank 0
//! re-forms the cluster with it (`server::worker::recover`). Rank 0 holds the
//! HTTP server and the requests, so its own end still ends the world. Other
//! commands (`run`, `bench`) keep fail-stop: a lost rank fails the run.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Restarts of one rank before the supervisor gives up on it and stops the world.
pub(crate) const MAX_RESTARTS: u32 = 20;
/// Pause between a rank's death and its restart (lets its port and segment go).
pub(crate) const RESTART_PAUSE: Duration = Duration::from_millis(500);

/// Whether `command` (the subcommand and its arguments) keeps serving across
/// rank losses.
pub(crate) fn restarts_ranks(command: &[String]) -> bool {
    command.first().is_some_and(|c| c == "serve")
}

/// What it takes to start a rank again: a copy of its `Command` (which is not
/// `Clone`) and, for ssh ranks, the host and the line written to ssh's stdin.
pub(crate) struct Recipe {
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    cwd: Option<PathBuf>,
    pub(crate) remote: Option<(String, String)>,
}

impl Recipe {
    pub(crate) fn of(cmd: &Command, remote: &Option<(String, String)>) -> Recipe {
        Recipe {
            program: cmd.get_program().to_owned(),
            args: cmd.get_args().map(|a| a.to_owned()).collect(),
            envs: cmd.get_envs().map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned()))).collect(),
            cwd: cmd.get_current_dir().map(|d| d.to_owned()),
            remote: remote.clone(),
        }
    }

    pub(crate) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args);
        for (k, v) in &self.envs {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(d) = &self.cwd {
            cmd.current_dir(d);
        }
        cmd
    }
}

/// A lost rank waiting for its restart.
pub(crate) struct PendingRestart {
    pub(crate) rank: usize,
    pub(crate) at: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recipe_rebuilds_the_same_command() {
        let mut c = Command::new("/bin/echo");
        c.args(["a", "b c"]).env("SHARDLM_RANK", "1").env_remove("X").current_dir("/tmp");
        let r = Recipe::of(&c, &None).command();
        assert_eq!(r.get_program(), "/bin/echo");
        assert_eq!(r.get_args().collect::<Vec<_>>(), ["a", "b c"]);
        assert_eq!(r.get_current_dir(), Some(std::path::Path::new("/tmp")));
        let envs: Vec<_> = r.get_envs().collect();
        assert!(envs.contains(&(std::ffi::OsStr::new("SHARDLM_RANK"), Some(std::ffi::OsStr::new("1")))));
        assert!(envs.contains(&(std::ffi::OsStr::new("X"), None)));
    }

    #[test]
    fn only_serve_restarts() {
        assert!(restarts_ranks(&["serve".into(), "--port".into(), "1".into()]));
        assert!(!restarts_ranks(&["run".into()]));
        assert!(!restarts_ranks(&[]));
    }
}
