//! The worker loop against a scripted transport, in paused (virtual) time: the
//! timings asserted are exact, and the tests take milliseconds.

use super::*;
use crate::worker::chaos::ChaosSettings;
use crate::worker::handler::{Done, HandlerResult, Job};
use crate::worker::simulated;
use crate::worker::transport::ClaimRef;
use crate::worker::{Report, WorkerState};
use serde_json::json;
use std::collections::VecDeque;
use std::sync::Mutex;

#[derive(Clone, Debug, PartialEq)]
enum Call {
    Claim,
    Heartbeat(i64, i64),
    Complete(i64, i64, Value),
    Fail(i64, i64, String),
    Snooze(i64, i64, Duration),
    Report(WorkerState, Option<i64>, i64, i64),
}

/// How the scripted queue answers heartbeats.
#[derive(Clone, Copy, Debug)]
enum Beats {
    /// Accepted, with this much lease left.
    Accept(Duration),
    /// Refused: the claim is lost.
    Refuse,
    /// Accepted with this much lease left until the given moment (from the
    /// script's start), refused from then on: an operator ended the claim.
    RefuseFrom(Duration, Duration),
    /// Never answered.
    Hang,
    /// The credential is refused (HTTP 401).
    Unauthorized,
}

struct Script {
    queue: Mutex<VecDeque<Claim>>,
    /// Every claim answers that the credential is refused (HTTP 401).
    refuse_claims: bool,
    beats: Beats,
    calls: Mutex<Vec<(Duration, Call)>>,
    start: Instant,
}

#[derive(Clone)]
struct Fake(Arc<Script>);

impl Fake {
    fn new(claims: Vec<Claim>, beats: Beats) -> Self {
        Fake(Arc::new(Script {
            queue: Mutex::new(claims.into()),
            refuse_claims: false,
            beats,
            calls: Mutex::new(Vec::new()),
            start: Instant::now(),
        }))
    }

    /// A queue that refuses this worker's credential on every claim.
    fn refusing_claims() -> Self {
        Fake(Arc::new(Script {
            queue: Mutex::new(VecDeque::new()),
            refuse_claims: true,
            beats: Beats::Unauthorized,
            calls: Mutex::new(Vec::new()),
            start: Instant::now(),
        }))
    }

    fn log(&self, call: Call) {
        let at = self.0.start.elapsed();
        self.0.calls.lock().unwrap().push((at, call));
    }

    fn calls(&self) -> Vec<(Duration, Call)> {
        self.0.calls.lock().unwrap().clone()
    }

    fn completions(&self) -> Vec<(Duration, Call)> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| matches!(c, Call::Complete(..) | Call::Fail(..) | Call::Snooze(..)))
            .collect()
    }

    fn heartbeats(&self) -> Vec<Duration> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| matches!(c, Call::Heartbeat(..)))
            .map(|(at, _)| at)
            .collect()
    }

    fn claims(&self) -> Vec<Duration> {
        self.calls()
            .into_iter()
            .filter(|(_, c)| *c == Call::Claim)
            .map(|(at, _)| at)
            .collect()
    }

    fn last_report(&self) -> Option<Call> {
        self.calls()
            .into_iter()
            .rev()
            .map(|(_, c)| c)
            .find(|c| matches!(c, Call::Report(..)))
    }
}

impl Transport for Fake {
    async fn claim(&self, _: &Holder) -> Result<Option<Claim>, TransportError> {
        self.log(Call::Claim);
        if self.0.refuse_claims {
            return Err(TransportError::Unauthorized(
                "401 Unauthorized: a worker token is required".into(),
            ));
        }
        Ok(self.0.queue.lock().unwrap().pop_front())
    }

    async fn heartbeat(&self, c: ClaimRef<'_>) -> Result<Option<Duration>, TransportError> {
        self.log(Call::Heartbeat(c.task_id, c.token));
        match self.0.beats {
            Beats::Accept(left) => Ok(Some(left)),
            Beats::Refuse => Err(TransportError::Lost("fencing token is not current".into())),
            Beats::RefuseFrom(left, from) => {
                if self.0.start.elapsed() >= from {
                    Err(TransportError::Lost("task is cancelled".into()))
                } else {
                    Ok(Some(left))
                }
            }
            Beats::Hang => std::future::pending().await,
            Beats::Unauthorized => Err(TransportError::Unauthorized(
                "401 Unauthorized: the worker token is not the server's".into(),
            )),
        }
    }

    async fn complete(&self, c: ClaimRef<'_>, output: &Value) -> Result<(), TransportError> {
        self.log(Call::Complete(c.task_id, c.token, output.clone()));
        Ok(())
    }

    async fn fail(&self, c: ClaimRef<'_>, error: &str) -> Result<(), TransportError> {
        self.log(Call::Fail(c.task_id, c.token, error.to_string()));
        Ok(())
    }

    // The outcome is the record's business (the store's tests read it);
    // the loop's tests see a failed attempt.
    async fn fail_as(
        &self,
        c: ClaimRef<'_>,
        error: &str,
        _outcome: crate::queue::AttemptOutcome,
    ) -> Result<(), TransportError> {
        self.fail(c, error).await
    }

    async fn snooze(&self, c: ClaimRef<'_>, delay: Duration) -> Result<(), TransportError> {
        self.log(Call::Snooze(c.task_id, c.token, delay));
        Ok(())
    }

    async fn report(&self, _: &Holder, r: &Report) -> Result<(), TransportError> {
        self.log(Call::Report(
            r.state,
            r.task_id,
            r.tasks_done,
            r.tasks_abandoned,
        ));
        Ok(())
    }
}

fn claim(task_id: i64, token: i64, data: Value, remaining: Duration) -> Claim {
    Claim {
        task_id,
        token,
        kind: simulated::KIND.into(),
        queue: "default".into(),
        attempt: 1,
        task_data: data,
        remaining: Some(remaining),
        timeout: None,
        parent_outputs: Default::default(),
        signals: Default::default(),
        wait_timed_out: None,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn start(fake: &Fake, chaos: ChaosSettings) -> (tokio::task::JoinHandle<Exit>, Controls) {
    let config = WorkerConfig::new(secs(3.0), secs(1.0));
    start_with(fake, simulated::handlers(&chaos), config, chaos)
}

fn start_with(
    fake: &Fake,
    handlers: Handlers,
    config: WorkerConfig,
    chaos: ChaosSettings,
) -> (tokio::task::JoinHandle<Exit>, Controls) {
    let (worker, controls) = Worker::new(
        Holder::parse("w1").unwrap(),
        fake.clone(),
        handlers,
        config,
        Chaos::seeded(chaos, 1),
    );
    (tokio::spawn(worker.run()), controls)
}

#[tokio::test(start_paused = true)]
async fn a_heard_cancel_heartbeats_at_once_and_the_refusal_stops_the_handler() {
    // Heartbeats 10 s apart (a 30 s lease); an operator ends the claim at
    // 2.5 s and it is announced. Other announcements change nothing.
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 600}),
            secs(30.0),
        )],
        Beats::RefuseFrom(secs(30.0), secs(2.5)),
    );
    let hub = crate::live::LiveHub::detached();
    let chaos = ChaosSettings::off();
    let (worker, controls) = Worker::new(
        Holder::parse("w1").unwrap(),
        fake.clone(),
        simulated::handlers(&chaos),
        WorkerConfig::new(secs(30.0), secs(10.0)),
        Chaos::seeded(chaos, 1),
    );
    let worker = worker.hearing_cancels(CancelSignal::new(&hub));
    let running = tokio::spawn(worker.run());
    sleep(secs(1.0)).await;
    hub.publish(crate::live::Topics::TASKS | crate::live::Topics::WORK);
    sleep(secs(1.5)).await;
    assert!(fake.heartbeats().is_empty(), "not a cancel: no heartbeat");
    hub.publish(crate::live::Topics::CANCELS);
    sleep(secs(1.0)).await;
    // One heartbeat, at the announcement, refused: the sleep stopped at
    // once (no lost grace waited out), nothing written for the claim, and
    // the worker idle again.
    assert_eq!(fake.heartbeats(), vec![secs(2.5)]);
    assert_eq!(fake.completions(), vec![]);
    let idle_at = fake
        .calls()
        .into_iter()
        .find(|(_, c)| *c == Call::Report(WorkerState::Idle, None, 0, 1))
        .map(|(at, _)| at);
    assert_eq!(idle_at, Some(secs(2.5)));
    controls.stop();
    assert_eq!(running.await.unwrap(), Exit::Stopped);
}

#[tokio::test(start_paused = true)]
async fn completes_after_its_ticks_with_its_token_heartbeating_meanwhile() {
    let fake = Fake::new(
        vec![claim(1, 7, json!({"sleep_duration_seconds": 3}), secs(3.0))],
        Beats::Accept(secs(3.0)),
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(10.0)).await;
    let done = fake.completions();
    assert_eq!(done.len(), 1, "{done:?}");
    let (at, call) = &done[0];
    assert_eq!(*at, secs(3.0));
    let Call::Complete(1, 7, output) = call else {
        panic!("{call:?}")
    };
    assert_eq!(output["ticks"], 3);
    assert_eq!(output["slept_seconds"], 3.0);
    assert_eq!(output["worker"], "w1");
    // Every second while working, none after.
    assert_eq!(fake.heartbeats(), vec![secs(1.0), secs(2.0)]);
    assert!(fake.claims().len() > 5, "went back to polling");
    assert_eq!(
        fake.last_report(),
        Some(Call::Report(WorkerState::Idle, None, 1, 0))
    );
    controls.stop();
    assert_eq!(worker.await.unwrap(), Exit::Stopped);
    assert_eq!(
        fake.last_report(),
        Some(Call::Report(WorkerState::Stopped, None, 1, 0))
    );
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_trusts_its_claims_writes_its_completion_regardless() {
    // The fault harness's worker: refused heartbeats and a passed local
    // deadline do not stop it, so the queue's fencing has to.
    let fake = Fake::new(
        vec![claim(1, 7, json!({"sleep_duration_seconds": 5}), secs(3.0))],
        Beats::Refuse,
    );
    let mut config = WorkerConfig::new(secs(3.0), secs(1.0));
    config.trust_claims = true;
    let (worker, controls) = start_with(
        &fake,
        simulated::handlers(&ChaosSettings::off()),
        config,
        ChaosSettings::off(),
    );
    sleep(secs(6.0)).await;
    let done = fake.completions();
    assert!(
        matches!(&done[..], [(at, Call::Complete(1, 7, _))] if *at == secs(5.0)),
        "{done:?}"
    );
    assert!(fake.heartbeats().len() >= 3, "it kept heartbeating");
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_refused_heartbeat_abandons_the_task_at_once() {
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 10}),
            secs(3.0),
        )],
        Beats::Refuse,
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(12.0)).await;
    assert_eq!(fake.completions(), vec![], "nothing written after the loss");
    assert_eq!(fake.heartbeats(), vec![secs(1.0)]);
    let claims = fake.claims();
    assert_eq!(claims[1], secs(1.0), "back to claiming right away");
    assert_eq!(
        fake.last_report(),
        Some(Call::Report(WorkerState::Idle, None, 0, 1))
    );
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn unanswered_heartbeats_abandon_the_task_before_the_lease_could_expire() {
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 10}),
            secs(3.0),
        )],
        Beats::Hang,
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(12.0)).await;
    assert_eq!(fake.completions(), vec![]);
    // Trusted for 3 s - 10 %: abandoned at 2.7 s, before the database
    // (which counted from after the send) could expire the lease.
    assert_eq!(fake.claims()[1], secs(2.7));
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_chaos_crash_stops_dead_without_writing_anything() {
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 10}),
            secs(3.0),
        )],
        Beats::Accept(secs(3.0)),
    );
    let chaos = ChaosSettings {
        enabled: true,
        crash_probability: 1.0,
        ..ChaosSettings::off()
    };
    let (worker, _controls) = start(&fake, chaos);
    assert_eq!(worker.await.unwrap(), Exit::Crashed);
    assert_eq!(fake.completions(), vec![]);
    assert_eq!(fake.heartbeats().len(), 4, "heartbeats until tick 5");
    assert_eq!(
        fake.last_report(),
        Some(Call::Report(WorkerState::Working, Some(1), 0, 0)),
        "no goodbye"
    );
}

#[tokio::test(start_paused = true)]
async fn stalls_delay_heartbeats_until_the_deadline_abandons_the_task() {
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 20}),
            secs(3.0),
        )],
        Beats::Accept(secs(3.0)),
    );
    let chaos = ChaosSettings {
        enabled: true,
        stall_probability: 1.0,
        ..ChaosSettings::off()
    };
    let (worker, controls) = start(&fake, chaos);
    sleep(secs(30.0)).await;
    // The first heartbeat stalls 4-15 s; the lease is trusted 2.7 s.
    assert_eq!(fake.heartbeats(), vec![]);
    assert_eq!(fake.completions(), vec![]);
    assert_eq!(fake.claims()[1], secs(2.7));
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_paused_worker_resumes_by_completing_with_its_old_token() {
    let fake = Fake::new(
        vec![claim(1, 7, json!({"sleep_duration_seconds": 5}), secs(3.0))],
        Beats::Accept(secs(3.0)),
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(1.5)).await;
    assert!(controls.pause(secs(5.0)));
    sleep(secs(10.0)).await;
    assert_eq!(fake.heartbeats(), vec![secs(1.0)], "none while frozen");
    let done = fake.completions();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].0, secs(6.5), "right after the pause");
    assert!(matches!(done[0].1, Call::Complete(1, 7, _)));
    assert!(
        fake.calls()
            .iter()
            .any(|(at, c)| *at == secs(1.5)
                && *c == Call::Report(WorkerState::Paused, Some(1), 0, 0))
    );
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn bad_task_data_fails_the_attempt_and_missing_data_takes_one_second() {
    let fake = Fake::new(
        vec![
            // A long bad value: the message quoting it is cut to what
            // the queue accepts.
            claim(
                1,
                7,
                json!({"sleep_duration_seconds": "soon".repeat(5000)}),
                secs(3.0),
            ),
            claim(2, 8, json!({}), secs(3.0)),
        ],
        Beats::Accept(secs(3.0)),
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(5.0)).await;
    let done = fake.completions();
    assert_eq!(done.len(), 2, "{done:?}");
    let Call::Fail(1, 7, why) = &done[0].1 else {
        panic!("{done:?}")
    };
    assert!(why.contains("sleep_duration_seconds"), "{why}");
    assert_eq!(
        why.chars().count(),
        crate::queue::store::MAX_ERROR_CHARS,
        "cut to the limit"
    );
    assert_eq!(done[1].0, secs(1.0));
    assert!(matches!(&done[1].1, Call::Complete(2, 8, out) if out["ticks"] == 1));
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stopping_gives_the_task_back() {
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 10}),
            secs(3.0),
        )],
        Beats::Accept(secs(3.0)),
    );
    let (worker, controls) = start(&fake, ChaosSettings::off());
    sleep(secs(2.5)).await;
    controls.stop();
    assert_eq!(worker.await.unwrap(), Exit::Stopped);
    let done = fake.completions();
    assert!(
        matches!(&done[..], [(_, Call::Fail(1, 7, why))] if why.contains("stopped")),
        "{done:?}"
    );
    assert_eq!(
        fake.last_report(),
        Some(Call::Report(WorkerState::Stopped, None, 0, 0))
    );
}

fn kind_claim(task_id: i64, kind: &str) -> Claim {
    Claim {
        kind: kind.into(),
        ..claim(task_id, 7, json!({}), secs(3.0))
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_error_fails_the_attempt_and_a_panic_does_not_kill_the_worker() {
    let fake = Fake::new(
        vec![
            kind_claim(1, "fails"),
            kind_claim(2, "panics"),
            kind_claim(3, "unknown"),
            kind_claim(4, "works"),
        ],
        Beats::Accept(secs(3.0)),
    );
    let handlers = Handlers::new()
        .register("fails", |_: Job, _: TaskContext| async {
            Err::<Done, _>("the mail server said no".into())
        })
        .register("panics", |job: Job, _: TaskContext| async move {
            if job.id == 2 {
                panic!("index out of bounds in task {}", job.id);
            }
            Ok(Done::empty())
        })
        .register("works", |job: Job, ctx: TaskContext| async move {
            Ok(Done::output(json!({
                "id": job.id, "attempt": job.attempt, "token": job.fencing_token,
                "worker": ctx.worker(),
            })))
        });
    let config = WorkerConfig::new(secs(3.0), secs(1.0));
    let (worker, controls) = start_with(&fake, handlers, config, ChaosSettings::off());
    sleep(secs(2.0)).await;
    let done: Vec<Call> = fake.completions().into_iter().map(|(_, c)| c).collect();
    assert_eq!(done.len(), 4, "{done:?}");
    assert_eq!(done[0], Call::Fail(1, 7, "the mail server said no".into()));
    assert!(
        matches!(&done[1], Call::Fail(2, 7, why)
            if why == "the handler panicked: index out of bounds in task 2"),
        "{done:?}"
    );
    assert!(
        matches!(&done[2], Call::Fail(3, 7, why) if why.contains("no handler for task kind \"unknown\"")),
        "{done:?}"
    );
    assert_eq!(
        done[3],
        Call::Complete(
            4,
            7,
            json!({"id": 4, "attempt": 1, "token": 7, "worker": "w1"})
        )
    );
    controls.stop();
    assert_eq!(
        worker.await.unwrap(),
        Exit::Stopped,
        "alive after the panic"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_claim_signals_the_handler_and_discards_its_answer() {
    let fake = Fake::new(vec![kind_claim(1, "watchful")], Beats::Refuse);
    let noticed = Arc::new(std::sync::Mutex::new(None));
    let seen = noticed.clone();
    let handlers = Handlers::new().register("watchful", move |_: Job, ctx: TaskContext| {
        let seen = seen.clone();
        async move {
            let started = Instant::now();
            ctx.lease_lost().await;
            *seen.lock().unwrap() = Some(started.elapsed());
            assert!(ctx.is_lost());
            // Answering after the loss: discarded, never written.
            HandlerResult::Ok(Done::output(json!("too late")))
        }
    });
    let config = WorkerConfig::new(secs(3.0), secs(1.0));
    let (worker, controls) = start_with(&fake, handlers, config, ChaosSettings::off());
    sleep(secs(5.0)).await;
    assert_eq!(
        *noticed.lock().unwrap(),
        Some(secs(1.0)),
        "at the refused heartbeat"
    );
    assert_eq!(fake.completions(), vec![], "nothing written after the loss");
    assert_eq!(fake.claims()[1], secs(1.0), "back to claiming at once");
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_snooze_puts_the_task_back_without_completing_or_failing_it() {
    let fake = Fake::new(vec![kind_claim(1, "later")], Beats::Accept(secs(3.0)));
    let handlers = Handlers::new().register("later", |_: Job, _: TaskContext| async {
        Ok(Done::snooze(secs(30.0)))
    });
    let config = WorkerConfig::new(secs(3.0), secs(1.0));
    let (worker, controls) = start_with(&fake, handlers, config, ChaosSettings::off());
    sleep(secs(1.0)).await;
    let done: Vec<Call> = fake.completions().into_iter().map(|(_, c)| c).collect();
    assert_eq!(done, vec![Call::Snooze(1, 7, secs(30.0))]);
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_attempt_past_its_time_limit_is_cancelled_and_failed() {
    // Task 1 sets its own limit (2 s); task 2 gets the kind's default (4 s);
    // task 3 has none and finishes after 5 s.
    let own = Claim {
        timeout: Some(secs(2.0)),
        ..kind_claim(1, "slow")
    };
    let fake = Fake::new(
        vec![own, kind_claim(2, "slow"), kind_claim(3, "unlimited")],
        Beats::Accept(secs(3.0)),
    );
    let noticed = Arc::new(Mutex::new(Vec::new()));
    let seen = noticed.clone();
    let slow = move |job: Job, ctx: TaskContext| {
        let seen = seen.clone();
        async move {
            let started = Instant::now();
            ctx.cancelled().await;
            seen.lock()
                .unwrap()
                .push((job.id, started.elapsed(), ctx.is_lost()));
            HandlerResult::Ok(Done::output(json!("discarded")))
        }
    };
    let handlers = Handlers::new()
        .register("slow", slow)
        .timeout("slow", secs(4.0))
        .register("unlimited", |_: Job, _: TaskContext| async {
            sleep(secs(5.0)).await;
            Ok(Done::output(json!("in its own time")))
        });
    let config = WorkerConfig::new(secs(3.0), secs(1.0));
    let (worker, controls) = start_with(&fake, handlers, config, ChaosSettings::off());
    sleep(secs(12.0)).await;
    assert_eq!(
        *noticed.lock().unwrap(),
        vec![(1, secs(2.0), false), (2, secs(4.0), false)],
        "cancelled at the limit, not lost"
    );
    let done: Vec<Call> = fake.completions().into_iter().map(|(_, c)| c).collect();
    assert_eq!(
        done,
        vec![
            Call::Fail(1, 7, "timed out after 2s".into()),
            Call::Fail(2, 7, "timed out after 4s".into()),
            Call::Complete(3, 7, json!("in its own time")),
        ]
    );
    controls.stop();
    worker.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_refused_credential_on_claiming_stops_the_worker_instead_of_retrying() {
    let fake = Fake::refusing_claims();
    let (worker, _controls) = start(&fake, ChaosSettings::off());
    let exit = tokio::time::timeout(secs(60.0), worker)
        .await
        .expect("the worker stopped by itself")
        .unwrap();
    assert_eq!(
        exit,
        Exit::Unauthorized("401 Unauthorized: a worker token is required".into())
    );
    assert_eq!(fake.claims(), vec![Duration::ZERO], "one claim, no retry");
}

#[tokio::test(start_paused = true)]
async fn a_heartbeat_refused_its_credential_abandons_the_task_and_stops() {
    // A 10 s task; the heartbeat at 1 s is refused 401 (the token was
    // rotated under it): the handler stops, nothing is written for the
    // claim (its lease runs out for a takeover), and the worker exits.
    let fake = Fake::new(
        vec![claim(
            1,
            7,
            json!({"sleep_duration_seconds": 10}),
            secs(3.0),
        )],
        Beats::Unauthorized,
    );
    let (worker, _controls) = start(&fake, ChaosSettings::off());
    let exit = tokio::time::timeout(secs(5.0), worker)
        .await
        .expect("the worker stopped by itself")
        .unwrap();
    assert!(
        matches!(&exit, Exit::Unauthorized(why) if why.contains("401")),
        "{exit:?}"
    );
    assert_eq!(fake.heartbeats(), vec![secs(1.0)]);
    assert_eq!(fake.completions(), vec![], "nothing written for the claim");
    assert_eq!(
        fake.claims(),
        vec![Duration::ZERO],
        "no claim after the refusal"
    );
}
