//! The worker loop's steps: one method for each thing the loop waits on (a claim's answer, an
//! attempt's event, the heartbeat's tick and answer, a stop signal), and whether it ends.

use super::*;

impl Daemon {
    /// Whether the loop ends: drained (every job finished and reported; the server is told),
    /// or out of time to wait for abandoned jobs after a second stop.
    pub(super) async fn ended(&self) -> bool {
        if self.draining && self.running.is_empty() && self.claims.tasks.is_empty() && self.reserve.is_empty() {
            tracing::info!("drained: every job finished and reported");
            self.leave().await;
            return true;
        }
        if self.abort_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            tracing::warn!(jobs = self.running.len(), "exiting before every abandoned job was reported");
            return true;
        }
        false
    }

    /// A request that could hand out jobs came back: its jobs start (or go back, draining), a
    /// finish's answer also goes to its attempt, a failure backs the next claim off, and an
    /// unknown session registers again.
    pub(super) async fn on_claim_answer(
        &mut self,
        finished: Result<(Claimed, u32, Generation), tokio::task::JoinError>,
    ) -> anyhow::Result<()> {
        let mut sent_under = self.session.generation;
        let finished = finished.map(|(claimed, asked, generation)| {
            self.slots_in_flight = self.slots_in_flight.saturating_sub(asked);
            sent_under = generation;
            claimed
        });
        if self.claims.tasks.is_empty() {
            // Nothing is in flight, whatever a task that failed had asked for.
            self.slots_in_flight = 0;
        }
        let claimed = match finished {
            Ok(Claimed::Claim(answer)) => answer.map(|response| response.jobs),
            Ok(Claimed::Finish(answer, reply)) => {
                let jobs = answer.as_ref().map(|response| response.jobs.clone()).map_err(copy_error);
                let _ = reply.send(answer);
                jobs
            }
            Err(error) => {
                tracing::error!(%error, "claim task failed");
                return Ok(());
            }
        };
        match claimed {
            Ok(jobs) => {
                self.claims.failures = 0;
                for job in jobs {
                    if self.draining {
                        self.give_back(job)
                    } else {
                        self.start(job)
                    }
                }
            }
            Err(error) if error.status() == Some(401) => self.unknown_session(&error, sent_under).await?,
            Err(error) => {
                self.claims.failures += 1;
                let delay = backoff(self.claims.failures);
                self.claims.not_before = Instant::now() + delay;
                if self.claims.failures == 1 || self.claims.failures.is_multiple_of(10) {
                    tracing::warn!(%error, retry_in = ?delay, "claiming work failed; retrying with backoff");
                }
            }
        }
        Ok(())
    }

    /// An attempt's process ended (its slot is free; it gets its GPU account), it is ready to
    /// finish (the finish claims the next jobs when it may), or it is done.
    pub(super) fn on_attempt_event(&mut self, event: AttemptEvent) {
        match event {
            AttemptEvent::ProcessEnded(attempt, account) => {
                self.reservations.release(attempt);
                let now = Instant::now();
                let short = self.running.get(&attempt).is_some_and(|held| now - held.started < RESERVE_SHORT);
                self.finishing.insert(attempt, (now, short));
                let _ = account.send(self.accounting.end(attempt, now_ms()));
                self.start_reserved();
            }
            AttemptEvent::Finishing { request, reply } => {
                let ended = self.finishing.remove(&JobAttempt { job_id: request.job_id, attempt: request.attempt });
                // The finish asks for the next jobs itself when it may (see `Claims`).
                let may_claim = self.claims.tasks.is_empty() || self.inventory.sample().is_empty();
                if may_claim && !self.draining && Instant::now() >= self.claims.not_before {
                    let short = ended.is_some_and(|(_, short)| short);
                    self.finish_and_claim(*request, reply, short);
                } else {
                    let (client, worker_id) = (self.session.client.clone(), self.session.worker_id);
                    tokio::spawn(async move {
                        let _ = reply.send(client.finish(worker_id, &request).await);
                    });
                }
            }
            AttemptEvent::Done(attempt) => {
                self.running.remove(&attempt);
                self.finishing.remove(&attempt);
            }
        }
    }

    /// Sends a heartbeat (with telemetry when it is due) and sweeps up what ended jobs left.
    pub(super) fn on_heartbeat_due(&mut self) {
        let telemetry_due = self.beats.last_telemetry.is_none_or(|at| at.elapsed() >= self.config.telemetry_interval);
        let gpus = if telemetry_due {
            self.beats.last_telemetry = Some(Instant::now());
            self.inventory.sample()
        } else {
            Vec::new()
        };
        let request = HeartbeatRequest { running: self.held(), gpus, saves: self.saves() };
        // Processes that left jobs which have ended: killed, their zombies reaped.
        let (containment, running) = (self.containment.clone(), self.running.keys().copied().collect());
        tokio::spawn(async move { containment.sweep(&running).await });
        let (client, worker_id) = (self.session.client.clone(), self.session.worker_id);
        let sent = tokio::spawn(async move { client.heartbeat(worker_id, &request).await });
        self.beats.in_flight = Some((self.session.generation, sent));
    }

    /// The heartbeat came back: its cancels apply, an unknown session registers again, and
    /// failures are told once in a while (jobs keep running meanwhile).
    pub(super) async fn on_heartbeat_answer(
        &mut self,
        answered: Result<ClientResult<HeartbeatResponse>, tokio::task::JoinError>,
    ) -> anyhow::Result<()> {
        let sent_under = self.beats.in_flight.take().map_or(self.session.generation, |(generation, _)| generation);
        match answered {
            Ok(Ok(response)) => {
                if self.beats.failures > 0 {
                    tracing::info!("the server is reachable again");
                }
                self.beats.failures = 0;
                self.apply(&response);
            }
            Ok(Err(error)) if matches!(error.status(), Some(401 | 404)) => {
                self.unknown_session(&error, sent_under).await?
            }
            Ok(Err(error)) => {
                self.beats.failures += 1;
                if self.beats.failures == 1 || self.beats.failures.is_multiple_of(12) {
                    tracing::warn!(%error, "heartbeat failed; jobs keep running, reports wait for the server");
                }
            }
            Err(error) => tracing::error!(%error, "heartbeat task failed"),
        }
        Ok(())
    }

    /// A stop signal: the first drains (no new jobs; running ones finish), the second (or the
    /// signal channel closing) kills the jobs and hands them back.
    pub(super) fn on_stop(&mut self, signal: Option<()>) {
        if signal.is_none() || self.draining {
            tracing::warn!(jobs = self.running.len(), "second stop: killing jobs and handing them back");
            for held in self.running.values() {
                let _ = held.stop.try_send(Stop::Abandon);
            }
            self.give_back_reserve();
            self.claims.tasks.abort_all();
            self.abort_deadline = Some(Instant::now() + self.config.kill_grace + Duration::from_secs(10));
            self.draining = true;
        } else {
            tracing::info!(
                jobs = self.running.len(),
                "draining: no new jobs; running jobs finish (stop again to kill them)"
            );
            self.draining = true;
            self.give_back_reserve();
            // The server ends this worker's parked claim at once and hands it nothing more; a
            // claim answered meanwhile is handed back (see `on_claim_answer`).
            let (client, worker_id) = (self.session.client.clone(), self.session.worker_id);
            tokio::spawn(async move {
                if let Err(error) = client.drain(worker_id).await {
                    tracing::warn!(%error, "telling the server this worker drains failed");
                }
            });
        }
    }
}
