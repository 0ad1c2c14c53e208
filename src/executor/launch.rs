//! The launcher: prepares an attempt's directory and environment, spawns its child in a process group
//! of its own, and hands the child to a [`Supervisor`] task that reports back to the dispatcher.
//! The dispatcher sees only the [`Launcher`] trait, so tests drive it with a fake.

use super::environment::RunEnv;
use super::output::OutputGate;
use super::supervise::{Control, Log, Output, Supervisor};
use super::{ExecError, Msg, StepRef, outputs};
use crate::flow::model::var;
use crate::flow::{Flow, Step};
use crate::os::fs::ExistingLog;
use crate::os::process as unix;
use crate::store::{AuxKind, AuxRun, StateDir, StepRecord, StepState};
use std::collections::HashSet;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// One attempt, recorded as starting and about to be spawned.
pub(crate) struct Attempt {
    pub(crate) step_index: usize,
    pub(crate) step: StepRef,
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    /// Run again after its runner died (an attempt cancelled by a signal runs again unmarked).
    pub(crate) redelivered: bool,
    /// The attempt's row in the store: its output and its end are tagged with it.
    pub(crate) row: i64,
    /// Its files without their extension (see [`StateDir::attempt_stem`]).
    pub(crate) stem: PathBuf,
    /// When its timeout passes: its clock started when the attempt was issued.
    pub(crate) deadline: Option<Instant>,
    /// The `WAYMARK_OUTPUT_<STEP>_<KEY>` variables of the steps that succeeded before it, as the
    /// run keeps them ([`super::outputs::RunOutputs::env`]: the same until a step's are kept).
    pub(crate) outputs: Arc<[(String, String)]>,
    /// Set when this is not an attempt but a command run around it: the step's catch handler
    /// (for the error of attempt `attempt`), its compensation, or a hook of the run.
    pub(crate) aux: Option<Aux>,
}

/// A command run around the attempts: what it is (for its log's banner), its command, and the
/// variables it gets besides a step's.
pub(crate) struct Aux {
    pub(crate) what: String,
    pub(crate) command: crate::flow::model::Command,
    pub(crate) env: Vec<(String, String)>,
}

/// What became of a spawn.
#[derive(Debug)]
pub(crate) enum Launched {
    /// The child runs; its supervisor will send [`Msg::Done`].
    Running {
        pid: u32,
        /// The child's start time, which identifies it across pid reuse after a runner crash.
        proc_start: Option<u64>,
        /// Where this attempt's output starts in its stderr log (earlier executions precede it).
        stderr_from: u64,
    },
    /// The program could not be started: the attempt's own failure (`ActionExecutionNotStarted`).
    NotStarted { why: String, stderr_from: u64 },
}

/// How the dispatcher starts and stops attempts.
pub(crate) trait Launcher {
    /// Make the attempt's step's log directory ready (or leave it to `spawn`, when no descriptor
    /// is left to make it: there the attempt fails as not started); returns the attempt's file
    /// stem. No file of the attempt is created: its logs are created on their first byte, its
    /// error and outputs files by the child if it writes them (what an earlier execution left
    /// there is removed when it is spawned).
    fn prepare(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError>;
    /// An attempt's file stem, whether or not it was prepared by this runner.
    fn stem(&self, step: &str, attempt: u32) -> PathBuf;
    /// Make the step's log directory ready for the catch handler run for the error of attempt
    /// `attempt`; returns the handler's file stem.
    fn prepare_handler(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError>;
    /// The file stem of a compensation (of step `name`) or a hook (`name`), its directory ready.
    fn prepare_aux(&mut self, kind: AuxKind, name: &str) -> Result<PathBuf, ExecError>;
    /// Spawn the attempt; its supervisor reports its output and its end to `events`.
    fn spawn(
        &mut self,
        attempt: Attempt,
        control: watch::Receiver<Control>,
        events: &mpsc::Sender<Msg>,
    ) -> Result<Launched, ExecError>;
    /// SIGKILL an attempt's whole process group now.
    fn kill(&mut self, pid: u32);
    /// Make sure what a dead runner left running (attempts, catch handlers, compensations and
    /// hooks) is dead: see [`Killed`].
    fn kill_leftovers(&mut self, left: &LeftRunning<'_>) -> Killed;
    /// Where a step's logs are.
    fn log_dir(&self, step: &str) -> PathBuf;
}

/// The launcher of real child processes.
pub(crate) struct ProcessLauncher {
    flow: Arc<Flow>,
    run_id: String,
    /// The env file's variables and the secrets, as this runner read them.
    env: Arc<RunEnv>,
    state: StateDir,
    /// Steps whose log directory this runner has made sure exists.
    log_dirs: HashSet<String>,
    /// `WAYMARK_PARAM_*` and `WAYMARK_OUTPUT*` variables in the runner's own environment (a
    /// runner started by a step of another run): not this run's, so its attempts do not get them.
    foreign: Vec<std::ffi::OsString>,
    /// The host the run's previous runner ran on, when it is another host: what it left running
    /// there is not this runner's to kill.
    pub(crate) elsewhere: Option<String>,
    /// Where the steps' programs were found on their PATH.
    programs: Programs,
    /// The environment the children inherit (the runner's, without `foreign`), made once.
    base_env: crate::os::spawn::BaseEnv,
    /// The environments of the steps run last, made by their first attempt for the next ones (at
    /// most [`STEP_ENVS`]).
    step_envs: Vec<StepVars>,
    /// The children's stdin, opened by the first spawn.
    devnull: Option<std::fs::File>,
    /// Whether the readers send the children's lines to the runner (a reporter shows them), or
    /// only write them to the logs.
    pub(crate) lines: bool,
    /// Where the readers wait before they send more lines, while a display that drops nothing
    /// is behind.
    pub(crate) gate: Option<Arc<OutputGate>>,
    /// In a nested run, the attempt ids of the steps it runs under (nearest first, comma-separated),
    /// which its steps carry (`WAYMARK_OUTER_ATTEMPT_IDS`) so that an outer runner finds them.
    outer_ids: Option<String>,
}

/// Programs found on a PATH, by name and PATH: looked up once per runner rather than by every
/// spawn (whose `execvp` tries each directory of the PATH before the program's in turn).
#[derive(Default)]
struct Programs(std::collections::HashMap<String, std::collections::HashMap<String, PathBuf>>);

impl Programs {
    /// Where `program` (a name without `/`) is on `path`: the first directory holding an
    /// executable file of that name, as `execvp` would find it. `None` when the answer could
    /// depend on the step's working directory (a relative or empty directory comes first) or
    /// nothing is found: the program is then looked up by the spawn itself, as ever.
    fn find(&mut self, program: &str, path: &str) -> Option<PathBuf> {
        if program.is_empty() || program.contains('/') {
            return None;
        }
        // By PATH, then by name: looked up without a key made for it.
        if let Some(found) = self.0.get(path).and_then(|programs| programs.get(program)) {
            return Some(found.clone());
        }
        for dir in path.split(':') {
            if !dir.starts_with('/') {
                return None;
            }
            let candidate = Path::new(dir).join(program);
            let executable = nix::unistd::access(&candidate, nix::unistd::AccessFlags::X_OK).is_ok();
            if executable && std::fs::metadata(&candidate).is_ok_and(|m| m.is_file()) {
                self.0.entry(path.to_owned()).or_default().insert(program.to_owned(), candidate.clone());
                return Some(candidate);
            }
        }
        None
    }

    /// Look `program` up again next time: spawning it by the path found failed.
    fn forget(&mut self, program: &str, path: &str) {
        if let Some(programs) = self.0.get_mut(path) {
            programs.remove(program);
        }
    }
}

impl ProcessLauncher {
    pub(crate) fn new(flow: Arc<Flow>, run_id: String, env: Arc<RunEnv>, state: StateDir) -> ProcessLauncher {
        let foreign: Vec<std::ffi::OsString> = std::env::vars_os()
            .map(|(name, _)| name)
            .filter(|name| {
                let name = name.as_encoded_bytes();
                name.starts_with(b"WAYMARK_PARAM_")
                    || name.starts_with(b"WAYMARK_OUTPUT")
                    || crate::flow::model::AUX_VARS.iter().any(|v| v.as_bytes() == name)
            })
            .collect();
        let base_env = crate::os::spawn::BaseEnv::capture(|name| foreign.iter().any(|f| f == name));
        // A nested run: the attempt this runner runs under, then those it runs under in turn.
        let outer_ids = [var::ATTEMPT_ID, var::OUTER_ATTEMPT_IDS]
            .iter()
            .filter_map(|name| std::env::var(name).ok())
            .flat_map(|ids| ids.split(',').filter(|id| !id.is_empty()).map(str::to_owned).collect::<Vec<_>>())
            .collect::<Vec<_>>()
            .join(",");
        ProcessLauncher {
            flow,
            run_id,
            env,
            state,
            log_dirs: HashSet::new(),
            base_env,
            step_envs: Vec::new(),
            devnull: None,
            foreign,
            elsewhere: None,
            programs: Programs::default(),
            lines: true,
            gate: None,
            outer_ids: (!outer_ids.is_empty()).then_some(outer_ids),
        }
    }

    /// The step's variables over the inherited environment, in the order they are set (a later
    /// one wins): see `environment` for the precedence. The attempt's own ([`ATTEMPT_VARS`],
    /// from [`ProcessLauncher::attempt_vars`]) come after them.
    fn step_vars(&self, a: &Attempt) -> Vec<(String, String)> {
        let step = &a.step;
        // `WAYMARK_OUTER_ATTEMPT_IDS` is waymark's alone: an `env` or env file's is not passed on.
        let mut env: Vec<(String, String)> = (self.env.layered(&self.flow, step))
            .filter(|(k, _)| *k != var::OUTER_ATTEMPT_IDS)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        env.extend(self.flow.param_values.iter().map(|(k, v)| (crate::flow::params::env_name(k), v.clone())));
        env.extend(a.outputs.iter().cloned());
        if let Some(aux) = &a.aux {
            env.extend(aux.env.iter().cloned());
        }
        env.extend([
            (var::RUN_ID.to_owned(), self.run_id.clone()),
            (var::FLOW.to_owned(), self.flow.name.clone()),
            (var::STEP.to_owned(), step.name.clone()),
            (var::MAX_ATTEMPTS.to_owned(), a.max_attempts.to_string()),
        ]);
        if let Some(ids) = &self.outer_ids {
            env.push((var::OUTER_ATTEMPT_IDS.to_owned(), ids.clone()));
        }
        env
    }

    /// The variables only this attempt has, those [`ATTEMPT_VARS`] names.
    fn attempt_vars(a: &Attempt, attempt_id: &str) -> [(String, String); 4] {
        [
            (var::ATTEMPT.to_owned(), a.attempt.to_string()),
            (var::ERROR_FILE.to_owned(), a.stem.with_extension("error.json").display().to_string()),
            (var::OUTPUT.to_owned(), outputs::path(&a.stem).display().to_string()),
            (var::ATTEMPT_ID.to_owned(), attempt_id.to_owned()),
        ]
    }

    /// The index in `step_envs` of the environment of `a`'s step, made now if it is not there.
    /// The environment of a command run around the attempts (`aux`) is made for it alone, last.
    fn step_env(&mut self, a: &Attempt) -> std::io::Result<usize> {
        // The rest of what a step's environment is made of is the runner's for all its run: the
        // flow, the env file and secrets, the parameters, and the step's budget of attempts. The
        // outputs are the same while they are the run's same variables (the entry holds them, so
        // their address is not reused).
        let same = |e: &StepVars| e.step == a.step_index && Arc::ptr_eq(&e.outputs, &a.outputs) && !e.aux;
        if let Some(i) = self.step_envs.iter().position(same).filter(|_| a.aux.is_none()) {
            let budget = (var::MAX_ATTEMPTS.to_owned(), a.max_attempts.to_string());
            debug_assert!(self.step_envs[i].vars.contains(&budget), "a step's budget changed in a run");
            // The one used last goes last: the first is the one to drop.
            self.step_envs[i..].rotate_left(1);
            return Ok(self.step_envs.len() - 1);
        }
        let vars = self.step_vars(a);
        // The PATH the program is looked up on: the step's environment's, else waymark's own.
        let path = vars.iter().rev().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone());
        let path = path.or_else(|| std::env::var("PATH").ok()).unwrap_or_else(|| "/bin:/usr/bin".to_owned());
        let prepared = self.base_env.prepare(&vars, &ATTEMPT_VARS)?;
        self.step_envs.retain(|e| !e.aux);
        if self.step_envs.len() == STEP_ENVS {
            self.step_envs.remove(0);
        }
        let (step, aux, outputs) = (a.step_index, a.aux.is_some(), Arc::clone(&a.outputs));
        self.step_envs.push(StepVars { step, outputs, aux, vars, path, prepared });
        Ok(self.step_envs.len() - 1)
    }
}

/// The names of the variables each attempt sets itself, after its step's.
const ATTEMPT_VARS: [&str; 4] = [var::ATTEMPT, var::ERROR_FILE, var::OUTPUT, var::ATTEMPT_ID];

/// How many steps' environments a runner keeps made: a step retried while others run in
/// parallel finds its own among them.
const STEP_ENVS: usize = 16;

/// A step's environment, made by its first attempt for the next ones: what it was made of (the
/// step, and the outputs of the steps that succeeded before), its variables, their PATH, and its
/// part of the children's environment.
struct StepVars {
    step: usize,
    outputs: Arc<[(String, String)]>,
    /// Made for a command run around the attempts, and for it alone.
    aux: bool,
    vars: Vec<(String, String)>,
    path: String,
    prepared: crate::os::spawn::StepEnv,
}

impl ProcessLauncher {
    /// Make sure the step's log directory exists (once per runner); `Err` with its path.
    fn log_dir_ready(&mut self, step: &Step) -> Result<(), (PathBuf, std::io::Error)> {
        if !self.log_dirs.contains(&step.name) {
            // In the run's log directory, made when the run started: not made again if it is gone.
            let dir = self.state.step_logs(&self.run_id, &step.name);
            crate::os::fs::create_dir_in_parent(&dir).map_err(|e| (dir, e))?;
            self.log_dirs.insert(step.name.clone());
        }
        Ok(())
    }
}

impl Launcher for ProcessLauncher {
    fn prepare(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError> {
        match self.log_dir_ready(step) {
            // Made by `spawn`, where want of descriptors is the attempt's failure, not the runner's.
            Err((_, e)) if lacks_files(&e) => {}
            Err((path, source)) => return Err(ExecError::Files { path, source }),
            Ok(()) => {}
        }
        Ok(self.stem(&step.name, attempt))
    }

    fn spawn(
        &mut self,
        a: Attempt,
        control: watch::Receiver<Control>,
        events: &mpsc::Sender<Msg>,
    ) -> Result<Launched, ExecError> {
        let attempt_id = attempt_id(&self.run_id, a.row);
        let files_err = |path: &Path, source| ExecError::Files { path: path.to_owned(), source };
        // The attempt's directory, opened once (refusing a symlink anywhere in its path): every
        // file of the attempt is found relative to it.
        let dir_path = a.stem.parent().unwrap_or(Path::new("."));
        // The attempt's command: its step's, or the compensation's or hook's it runs.
        let command = a.aux.as_ref().map_or(&a.step.command, |aux| &aux.command);
        let program = command.program();
        // Out of descriptors (this process's limit or the system's), the attempt does not start:
        // it fails with `ActionExecutionNotStarted`, which a retry policy retries after its
        // backoff, and the steps already running go on. Any other failure to make its files is
        // the runner's own.
        let refused = |path: &Path, e, stderr_from| match out_of_files(program, &e) {
            Some(why) => Ok(Launched::NotStarted { why, stderr_from }),
            None => Err(files_err(path, e)),
        };
        // A step's, unless `prepare` made it (compensations and hooks have theirs made by
        // `prepare_aux`).
        if a.aux.is_none()
            && let Err((path, e)) = self.log_dir_ready(&a.step)
        {
            return refused(&path, e, u64::MAX);
        }
        let dir = match crate::os::fs::open_dir_nofollow(dir_path, false) {
            Ok(dir) => Arc::new(dir),
            Err(e) => return refused(dir_path, e, u64::MAX),
        };
        // The child creates its error and outputs files if it writes them: whatever an earlier
        // execution of this attempt (a runner that died, or was stopped) left at their paths
        // goes first, so that it cannot be taken for this execution's.
        for path in outputs::child_files(&a.stem) {
            let name = file_name(&path).map_err(|e| files_err(&path, e))?;
            crate::os::fs::remove_any_at(&*dir, name, &path).map_err(|e| files_err(&path, e))?;
        }
        let stdout_log = a.stem.with_extension("stdout");
        let stderr_log = a.stem.with_extension("stderr");
        let (out_log, _) = match open_log(&dir, &stdout_log, &a) {
            Ok(log) => log,
            Err(e) => return refused(&stdout_log, e, u64::MAX),
        };
        let (err_log, stderr_from) = match open_log(&dir, &stderr_log, &a) {
            Ok(log) => log,
            Err(e) => return refused(&stderr_log, e, u64::MAX),
        };
        drop(dir);
        let step = a.step.clone();
        if !step.workdir.is_dir() {
            let why = format!("working directory {} does not exist or is not a directory", step.workdir.display());
            return Ok(Launched::NotStarted { why, stderr_from });
        }
        let argv = command.argv_ref();
        // A pipe is refused only for want of descriptors.
        let no_pipe = |e: std::io::Error| Launched::NotStarted {
            why: out_of_files(program, &e)
                .unwrap_or_else(|| format!("cannot start `{program}`: cannot make a pipe for its output: {e}")),
            stderr_from,
        };
        let own = ProcessLauncher::attempt_vars(&a, &attempt_id);
        let step_env = match self.step_env(&a) {
            Ok(i) => &self.step_envs[i],
            // A NUL byte in a variable, as std's spawn would say it.
            Err(e) => return Ok(Launched::NotStarted { why: format!("cannot start `{}`: {e}", argv[0]), stderr_from }),
        };
        let path = &step_env.path;
        if self.devnull.is_none() {
            match std::fs::File::open("/dev/null") {
                Ok(null) => self.devnull = Some(null),
                Err(e) => {
                    let why = out_of_files(program, &e)
                        .unwrap_or_else(|| format!("cannot open /dev/null for its stdin: {e}"));
                    return Ok(Launched::NotStarted { why, stderr_from });
                }
            }
        }
        let devnull = self.devnull.as_ref().expect("opened above");
        // A program named by a path (a `shell` step's /bin/sh) is spawned by it, from the step's
        // working directory as `execvp` would; a bare name is looked up on PATH once per runner.
        let found = match argv[0].contains('/') {
            true => Some(PathBuf::from(&argv[0])),
            false => self.programs.find(&argv[0], path),
        };
        // Whether one of the runner's signals had come before the spawn: taken now, as a signal
        // that comes while the runner sets up the child's supervision came after it started (on
        // a loaded machine, long enough for the child to have ended of it).
        let signalled_before = crate::os::signals::runner_signalled();
        // Spawned by the path found earlier, else (or if that fails: the program moved since)
        // by its name, looked up on PATH as ever.
        let mut by_name = found.is_none();
        let (child, out_r, err_r) = loop {
            let pipes = std::io::pipe().and_then(|out| Ok((out, std::io::pipe()?)));
            let ((out_r, out_w), (err_r, err_w)) = match pipes {
                Ok(pipes) => pipes,
                Err(e) => return Ok(no_pipe(e)),
            };
            let spawned = match (&found, by_name) {
                // The common case: the program's path is known, and the environment is the
                // runner's (made once) with the step's (made by an earlier attempt, most often)
                // and then the attempt's variables over it.
                (Some(program), false) => step_env.prepared.child(&self.base_env, &own).and_then(|env| {
                    crate::os::spawn::spawn(&crate::os::spawn::Spawn {
                        program,
                        argv: &argv,
                        env: &env,
                        workdir: &step.workdir,
                        stdin: std::os::fd::AsFd::as_fd(devnull),
                        stdout: std::os::fd::AsFd::as_fd(&out_w),
                        stderr: std::os::fd::AsFd::as_fd(&err_w),
                    })
                    .map(crate::os::spawn::Child::new)
                }),
                // Looked up on the PATH by the spawn itself, as `execvp` does.
                _ => {
                    let mut cmd = std::process::Command::new(&argv[0]);
                    for name in &self.foreign {
                        cmd.env_remove(name);
                    }
                    cmd.args(&argv[1..])
                        .envs(step_env.vars.iter().chain(&own).map(|(k, v)| (k, v)))
                        .current_dir(&step.workdir)
                        .stdin(std::process::Stdio::null())
                        .stdout(match out_w.try_clone() {
                            Ok(w) => w,
                            Err(e) => return Ok(no_pipe(e)),
                        })
                        .stderr(match err_w.try_clone() {
                            Ok(w) => w,
                            Err(e) => return Ok(no_pipe(e)),
                        });
                    crate::os::spawn::Child::spawned(&mut cmd)
                }
            };
            // The write ends are closed here, so the readers see EOF when the child exits.
            drop((out_w, err_w));
            match spawned {
                Ok(child) => break (child, out_r, err_r),
                Err(e) if let Some(why) = out_of_files(program, &e) => {
                    return Ok(Launched::NotStarted { why, stderr_from });
                }
                Err(_) if !by_name => {
                    self.programs.forget(&argv[0], path);
                    by_name = true;
                }
                Err(e) => {
                    let why = spawn_failure(&argv[0], &step.workdir, path, &e);
                    return Ok(Launched::NotStarted { why, stderr_from });
                }
            }
        };
        let outputs = [
            Output { pipe: out_r, log: out_log, log_path: stdout_log, lines: self.lines, gate: self.gate.clone() },
            Output { pipe: err_r, log: err_log, log_path: stderr_log, lines: self.lines, gate: self.gate.clone() },
        ];
        // The child's own files are its data: only the declared secrets are taken out of them.
        let declared = Arc::clone(&self.env.declared);
        // What its notes name it: a compensation or hook by its own name.
        let what = a.aux.as_ref().map_or("this attempt".into(), |aux| aux.what.clone().into());
        let supervisor = Supervisor::watch(
            child,
            (attempt_id, what),
            a.step_index,
            a.row,
            outputs,
            Arc::clone(&self.env.secrets),
            events,
        )
        .signalled_before(signalled_before);
        let pid = supervisor.pid();
        let proc_start = unix::process_start_time(pid);
        let (tx, index, row, deadline) = (events.clone(), a.step_index, a.row, a.deadline);
        let stem = a.stem;
        tokio::spawn(async move {
            let f = supervisor.supervise(step, deadline, control).await;
            let (end, exited, killed_after_grace) = (f.end, f.exited, f.killed_after_grace);
            let mut notes = f.notes;
            let mut left = super::Left { stderr_tail: f.stderr_tail, error_file: None, leader: Some(f.leader) };
            // The files the child may have written itself hide the secrets however it ended: the
            // runner reads the error file of a failure and the outputs of a success only, and
            // keeps both. On the blocking pool: a file can be as large as the child made it, and
            // the runner's thread goes on with the other steps meanwhile.
            if !declared.is_empty() {
                let paths = outputs::child_files(&stem);
                let unhidden = |path: &Path, e: &dyn std::fmt::Display| {
                    format!("cannot hide the secrets in {}: {e}; they may still be in it: delete it", path.display())
                };
                let scrub = {
                    let paths = paths.clone();
                    // A success's error file is not read: only scrubbed.
                    let reads_error = !matches!(end, super::End::Exited(crate::os::process::ExitKind::Code(0)));
                    move || {
                        use crate::classify::error_file::{ErrorFileOutcome, read_error_file};
                        let [error_path, outputs_path] = &paths;
                        // Its error is read from the file as the step wrote it: a secret in its
                        // class name does not change the class its retry policy matches.
                        let first = reads_error.then(|| read_error_file(error_path));
                        // The error file's strings may hold a secret in JSON's escapes.
                        let unscrubbed = [
                            (error_path, declared.scrub_json_file(error_path, outputs::MAX_FILE as u64)),
                            (outputs_path, declared.scrub_file(outputs_path)),
                        ];
                        let notes: Vec<String> = unscrubbed
                            .into_iter()
                            .filter_map(|(path, done)| done.err().map(|e| unhidden(path, &e)))
                            .collect();
                        // A file it cannot take is said with a warning that quotes it, cut (where
                        // a secret would not be found whole): quoted as scrubbed. One that only
                        // the scrubbing made valid is not taken, and not quoted.
                        let error_file = first.map(|first| match first {
                            ErrorFileOutcome::Invalid(_) => match read_error_file(error_path) {
                                again @ ErrorFileOutcome::Invalid(_) => again,
                                _ => ErrorFileOutcome::Invalid(format!(
                                    "error file {}: not valid as the step wrote it (not quoted: it holds a secret)",
                                    error_path.display()
                                )),
                            },
                            taken => taken,
                        });
                        (notes, error_file.map(Box::new))
                    }
                };
                match tokio::task::spawn_blocking(scrub).await {
                    Ok((unhidden_in, error_file)) => {
                        notes.extend(unhidden_in);
                        left.error_file = error_file;
                    }
                    Err(e) => notes.extend(paths.iter().map(|path| unhidden(path, &e))),
                }
            }
            let _ = tx.send(Msg::Done { step: index, row, end, exited, killed_after_grace, notes, left }).await;
        });
        Ok(Launched::Running { pid, proc_start, stderr_from })
    }

    fn stem(&self, step: &str, attempt: u32) -> PathBuf {
        self.state.attempt_stem(&self.run_id, step, attempt)
    }

    fn prepare_handler(&mut self, step: &Step, attempt: u32) -> Result<PathBuf, ExecError> {
        self.log_dir_ready(step).map_err(|(path, source)| ExecError::Files { path, source })?;
        Ok(self.state.handler_stem(&self.run_id, &step.name, attempt))
    }

    fn prepare_aux(&mut self, kind: AuxKind, name: &str) -> Result<PathBuf, ExecError> {
        let stem = self.state.aux_stem(&self.run_id, kind, name);
        // In the run's log directory (a step's, or `hooks`), as a step's log directory is.
        if let Some(dir) = stem.parent() {
            crate::os::fs::create_dir_in_parent(dir)
                .map_err(|source| ExecError::Files { path: dir.to_owned(), source })?;
        }
        Ok(stem)
    }

    fn kill(&mut self, pid: u32) {
        unix::kill_group(pid);
    }

    fn kill_leftovers(&mut self, left: &LeftRunning<'_>) -> Killed {
        let Some(host) = &self.elsewhere else { return kill_leftovers(&self.state, &self.run_id, left) };
        let mut said = Vec::new();
        for step in &left.steps {
            let message = match &step.state {
                StepState::InFlight { attempt, .. } => format!(
                    "attempt {attempt} was in flight on host {host}, whose runner was lost (ActionExecutionLost); it \
                     is redelivered here as attempt {attempt} (waymark never kills by a pid recorded on another host)"
                ),
                // The attempt had ended: its catch handler was running, and runs again.
                StepState::Catching { attempt, in_flight: Some(_) } => format!(
                    "the catch handler of attempt {attempt} was left running on host {host}, whose runner was lost; \
                     it is run again here (waymark never kills by a pid recorded on another host)"
                ),
                _ => continue,
            };
            said.push((Some(step.name.clone()), message));
        }
        for (aux, _) in &left.aux {
            said.push((
                None,
                format!(
                    "{} `{}` was left running on host {host}, whose runner was lost; it is run again here (waymark \
                     never kills by a pid recorded on another host)",
                    aux.kind.as_str(),
                    aux.name
                ),
            ));
        }
        (said, None)
    }

    fn log_dir(&self, step: &str) -> PathBuf {
        self.state.step_logs(&self.run_id, step)
    }
}

/// The name of the file at `path` in its directory.
fn file_name(path: &Path) -> std::io::Result<&std::ffi::OsStr> {
    path.file_name().ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))
}

/// A log in `dir` to append to, with its length before this attempt: the file an earlier
/// execution of the same attempt left (a line then marks where this one begins), else one created
/// on the first byte.
fn open_log(dir: &Arc<OwnedFd>, path: &Path, a: &Attempt) -> std::io::Result<(Log, u64)> {
    let name = file_name(path)?;
    let (mut file, mut len) = match crate::os::fs::open_existing_log_at(&**dir, name, path)? {
        ExistingLog::Missing => return Ok((Log::Deferred { dir: Arc::clone(dir), name: name.to_owned() }, 0)),
        ExistingLog::Open(file, len) => (file, len),
    };
    if len > 0 {
        let what = match &a.aux {
            Some(aux) => aux.what.clone(),
            None => format!("attempt {}", a.attempt),
        };
        let text = format!(
            "\n==> waymark: {what} {} at {} <==\n",
            if a.redelivered { "redelivered" } else { "runs again" },
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        );
        file.write_all(text.as_bytes())?;
        len += text.len() as u64;
    }
    Ok((Log::Open(file), len))
}

/// Whether `e` is the want of a file descriptor (this process's limit or the system's).
fn lacks_files(e: &std::io::Error) -> bool {
    matches!(crate::os::fs::errno(e), Some(libc::EMFILE | libc::ENFILE))
}

/// Why an attempt of `program` could not start for want of file descriptors, or `None` when `e`
/// is another failure.
fn out_of_files(program: &str, e: &std::io::Error) -> Option<String> {
    let limit = match crate::os::fs::errno(e)? {
        libc::EMFILE => "waymark's own limit (`ulimit -n`)",
        libc::ENFILE => "the system's limit (`sysctl fs.file-max`)",
        _ => return None,
    };
    Some(format!(
        "cannot start `{program}`: no file descriptor left to start it with (its log directory, pipes, stdin), \
         {limit} is reached; fewer steps at once (`max_parallel`) or a higher limit leaves room"
    ))
}

/// Why the program could not be executed, in words that say what to fix.
fn spawn_failure(program: &str, workdir: &Path, path: &str, e: &std::io::Error) -> String {
    let path_like = program.contains('/');
    match e.kind() {
        std::io::ErrorKind::NotFound if !path_like => format!("program `{program}` not found in PATH ({path})"),
        std::io::ErrorKind::NotFound if workdir.join(program).exists() => {
            format!("cannot execute `{program}`: its #! interpreter (or a library it needs) was not found")
        }
        std::io::ErrorKind::NotFound => format!("program `{program}` not found"),
        std::io::ErrorKind::PermissionDenied => format!("program `{program}` is not executable: {e}"),
        std::io::ErrorKind::ArgumentListTooLong => format!(
            "cannot start `{program}`: its arguments and environment are more than the system passes to a program \
             ({e}: at most 128 KiB in any one of them, and about 2 MiB in all, the outputs of earlier steps \
             (`WAYMARK_OUTPUT_*`) included); pass large values in files"
        ),
        _ => format!("cannot start `{program}`: {e}"),
    }
}

/// The `WAYMARK_ATTEMPT_ID` of an attempt: unique per execution, inherited by all its processes.
fn attempt_id(run_id: &str, row: i64) -> String {
    format!("{run_id}.{row}")
}

/// What a dead runner left running of a run, for [`kill_leftovers`]: the steps whose attempt (or
/// catch handler) was in flight, and the compensations and hooks that had not finished, each with
/// whether the files at its stem are its own (no later run of the same one made them since).
pub(crate) struct LeftRunning<'a> {
    pub(crate) steps: Vec<&'a StepRecord>,
    pub(crate) aux: Vec<(&'a AuxRun, bool)>,
}

impl<'a> LeftRunning<'a> {
    /// What a dead runner left running of a run whose steps and compensation and hook runs are
    /// recorded as `steps` and `aux`.
    pub(crate) fn of(steps: &'a [StepRecord], aux: &'a [AuxRun]) -> LeftRunning<'a> {
        LeftRunning {
            steps: steps
                .iter()
                .filter(|s| matches!(s.state, StepState::InFlight { .. } | StepState::Catching { .. }))
                .collect(),
            aux: aux.iter().filter(|run| !run.finished).map(|run| (run, !run.superseded(aux))).collect(),
        }
    }
}

/// What [`kill_leftovers`] did: a message for the user, with the step it is about (none for a
/// compensation or hook, which names itself), for each that had to be killed; and the first error,
/// when some would not die (nothing may run twice at once) or their files could not be removed.
/// The messages are said either way: what was killed was killed.
pub(crate) type Killed = (Vec<(Option<String>, String)>, Option<ExecError>);

/// Make sure what a dead runner left running of run `run_id` is dead: each execution's process
/// group (checked against the recorded start time) and its processes that left the group, all
/// killed at once and waited for together.
pub(crate) fn kill_leftovers(state: &StateDir, run_id: &str, left: &LeftRunning<'_>) -> Killed {
    // What each is: its step (if a step's), its row, group and leader, its name in the message,
    // the stem of its files (removed once it is dead, if its own) and its attempt number.
    struct Target {
        step: Option<String>,
        id: String,
        pgid: Option<u32>,
        leader_start: Option<u64>,
        what: String,
        stem: Option<PathBuf>,
        attempt: u32,
    }
    let mut targets = Vec::new();
    for step in &left.steps {
        let (attempt, row, pid, proc_start, what, stem) = match &step.state {
            StepState::InFlight { attempt, row, pid, proc_start } => {
                let stem = state.attempt_stem(run_id, &step.name, *attempt);
                (*attempt, row, pid, proc_start, format!("attempt {attempt}"), stem)
            }
            StepState::Catching { attempt, in_flight: Some((row, pid, proc_start)) } => {
                let stem = state.handler_stem(run_id, &step.name, *attempt);
                (*attempt, row, pid, proc_start, format!("the catch handler of attempt {attempt}"), stem)
            }
            _ => continue,
        };
        let (id, step) = (attempt_id(run_id, *row), Some(step.name.clone()));
        targets.push(Target { step, id, pgid: *pid, leader_start: *proc_start, what, stem: Some(stem), attempt });
    }
    for (aux, own_files) in &left.aux {
        targets.push(Target {
            step: None,
            id: attempt_id(run_id, aux.row),
            pgid: aux.pid,
            leader_start: aux.proc_start,
            what: format!("{} `{}`", aux.kind.as_str(), aux.name),
            stem: own_files.then(|| state.aux_stem(run_id, aux.kind, &aux.name)),
            attempt: 1,
        });
    }
    if targets.is_empty() {
        return (Vec::new(), None);
    }
    let looked_for: Vec<unix::Leftover<'_>> = targets
        .iter()
        .map(|t| unix::Leftover { pgid: t.pgid, leader_start: t.leader_start, attempt_id: &t.id })
        .collect();
    let killed = unix::kill_leftovers(&looked_for, Duration::from_secs(5));
    let (mut said, mut error) = (Vec::new(), None);
    for (t, killed) in targets.iter().zip(killed) {
        let would_not_die = |pids| ExecError::Leftovers {
            step: t.step.clone().unwrap_or_else(|| t.what.clone()),
            attempt: t.attempt,
            pids,
        };
        match made_sure_dead(killed, &t.what, t.stem.as_deref(), would_not_die) {
            Ok(Some(message)) => said.push((t.step.clone(), message)),
            Ok(None) => {}
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    (said, error)
}

/// What `unix::kill_leftovers` did to what is left of `what`: an error (`would_not_die`) when some
/// of its processes survived; else its error and outputs files at `stem` removed, if given, and a
/// message when something had to be killed.
fn made_sure_dead(
    (killed, survivors): (usize, Vec<u32>),
    what: &str,
    stem: Option<&Path>,
    would_not_die: impl FnOnce(Vec<u32>) -> ExecError,
) -> Result<Option<String>, ExecError> {
    if !survivors.is_empty() {
        return Err(would_not_die(survivors));
    }
    if let Some(stem) = stem {
        remove_unread_files(stem)?;
    }
    Ok((killed > 0).then(|| format!("killed {killed} leftover process(es) of {what} from the previous runner")))
}

/// The error and outputs files of an execution that was cut short, once it is dead. Nothing reads
/// them (its redelivery starts without them, and an abandoned run is over), and only an execution
/// that ends has its files scrubbed of the run's secrets: they go, so that no secret stays there.
fn remove_unread_files(stem: &Path) -> Result<(), ExecError> {
    for path in outputs::child_files(stem) {
        match crate::os::fs::remove_any(&path) {
            // Its directory is gone too (a log directory deleted by hand): nothing to remove.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other.map_err(|source| ExecError::Files { path, source })?,
        }
    }
    Ok(())
}
