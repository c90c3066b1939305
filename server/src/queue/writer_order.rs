//! Which work the writer thread runs next: the units at the head in the order they came, a
//! kind at a time (a group of units, a group of steps, an outside task alone), and the
//! background lane, whose units wait for the writer to be idle or for their turn under load.

use super::*;

/// A background unit waits until the writer has had no other unit for this long: units that
/// come in a steady stream (finishes and claims) leave gaps shorter than this between groups.
pub(super) const IDLE: Duration = Duration::from_millis(2);
/// Under a steady stream of other units, a background unit still runs this long after it
/// became the next one (or after the one before it ran).
pub(super) const BACKGROUND_EVERY: Duration = Duration::from_millis(100);

/// Files `work` as waiting, or (a background unit) as background; a background unit that
/// becomes the next one is due `every` from now.
fn arrive(
    work: Work,
    waiting: &mut VecDeque<Work>,
    background: &mut VecDeque<RunUnit>,
    (due, every): (&mut Instant, Duration),
) {
    match work {
        Work::Background(unit) => {
            if background.is_empty() {
                *due = Instant::now() + every;
            }
            background.push_back(unit);
        }
        work => waiting.push_back(work),
    }
}

/// Starts the writer thread on `pool` (SQLite: its own connection to the database file;
/// PostgreSQL: one connection of the pool); it ends when every [`Writer`] is dropped, and the
/// returned receiver is told then. Call from inside the runtime.
pub fn start(pool: WriterPool, events: Events) -> (Writer, oneshot::Receiver<()>) {
    start_with(pool, events, BACKGROUND_EVERY)
}

/// [`start`], with background units due `background_every` after they became the next one.
pub(super) fn start_with(
    pool: WriterPool,
    events: Events,
    background_every: Duration,
) -> (Writer, oneshot::Receiver<()>) {
    let (sender, receiver) = mpsc::channel(QUEUE_DEPTH);
    let refused = Arc::new(Mutex::new(None));
    let (ended, ends) = oneshot::channel();
    let state = Thread { handle: Handle::current(), pool, events, refused: refused.clone(), background_every };
    std::thread::Builder::new()
        .name("app-writer".into())
        .spawn(move || {
            // Inside the runtime's context, so that what the units drop (a pool connection)
            // and spawn can reach it.
            let _context = state.handle.enter();
            state.run(receiver);
            let _ = ended.send(());
        })
        .expect("starting the writer thread");
    (Writer { sender, refused }, ends)
}

impl Thread {
    pub(super) fn run(&self, mut receiver: mpsc::Receiver<Work>) {
        let mut connection: Option<WriterConn> = None;
        // PostgreSQL's one-statement step groups run on a connection of their own.
        let mut lane: Option<PgConnection> = None;
        let mut waiting: VecDeque<Work> = VecDeque::new();
        let mut background: VecDeque<RunUnit> = VecDeque::new();
        // When the next background unit runs even while other units keep coming: BACKGROUND_EVERY
        // after it became the next one, or after the one before it ran.
        let mut background_due = Instant::now();
        // When the writer last ran (or found waiting) units other than background ones.
        let mut foreground_busy = Instant::now();
        loop {
            if waiting.is_empty() {
                let quiet = IDLE.saturating_sub(foreground_busy.elapsed());
                let next = match background.is_empty() {
                    true => receiver.blocking_recv(),
                    false => match self.handle.block_on(tokio::time::timeout(quiet, receiver.recv())) {
                        Ok(next) => next,
                        Err(_) => {
                            // Nothing else for IDLE: the background unit's turn.
                            connection = self.run_background(connection, &mut background, &mut background_due);
                            continue;
                        }
                    },
                };
                match next {
                    Some(work) => {
                        arrive(work, &mut waiting, &mut background, (&mut background_due, self.background_every))
                    }
                    None => return,
                }
            }
            while waiting.len() < MAX_GROUP {
                match receiver.try_recv() {
                    Ok(work) => {
                        arrive(work, &mut waiting, &mut background, (&mut background_due, self.background_every))
                    }
                    Err(_) => break,
                }
            }
            if !background.is_empty() && Instant::now() >= background_due {
                connection = self.run_background(connection, &mut background, &mut background_due);
                continue;
            }
            if waiting.is_empty() {
                continue;
            }
            // The units at the head of one kind form a group (the order units came in is kept);
            // an outside task at the head runs alone.
            match waiting.pop_front() {
                Some(Work::Outside(task)) => self.handle.block_on(task()),
                Some(Work::Unit(unit)) => {
                    let mut group = VecDeque::from([unit]);
                    while let Some(Work::Unit(_)) = waiting.front() {
                        if let Some(Work::Unit(unit)) = waiting.pop_front() {
                            group.push_back(unit);
                        }
                    }
                    connection = self.handle.block_on(self.run_units(connection.take(), group));
                }
                Some(Work::Step(unit)) => {
                    let mut group = VecDeque::from([*unit]);
                    while let Some(Work::Step(_)) = waiting.front() {
                        if let Some(Work::Step(unit)) = waiting.pop_front() {
                            group.push_back(*unit);
                        }
                    }
                    connection = self.handle.block_on(self.run_steps(connection.take(), &mut lane, group));
                }
                // `arrive` keeps background units out of `waiting`.
                Some(Work::Background(_)) | None => {}
            }
            foreground_busy = Instant::now();
        }
    }

    /// Runs the next background unit in a group of its own; the one after it is due
    /// [`BACKGROUND_EVERY`] later.
    fn run_background(
        &self,
        connection: Option<WriterConn>,
        background: &mut VecDeque<RunUnit>,
        due: &mut Instant,
    ) -> Option<WriterConn> {
        let Some(unit) = background.pop_front() else { return connection };
        let connection = self.handle.block_on(self.run_units(connection, VecDeque::from([unit])));
        *due = Instant::now() + self.background_every;
        connection
    }
}
