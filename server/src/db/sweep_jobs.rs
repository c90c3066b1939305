//! A sweep's job rows: the bulk insert, and the expansion of a large sweep on SQLite, whose rows
//! after the first few thousand are written after its submission has returned, one chunk per
//! write unit (decision 0076).
//!
//! How a large sweep keeps its place in the queue: its submission picks the ids its jobs get
//! (the next free id and up, in index order), writes its first chunk and its last job under
//! them, and stores the others as encoded chunks in `job_expansions`. SQLite gives every later
//! row an id above the largest, so no other insert takes an id in the gap, and dispatch order
//! (priority, then id) stays submission order. The last job is `held` until the expansion
//! ends, so it does not run before the others. Chunks are written by priority, then in
//! submission order. Cancelling all of a sweep's queued jobs first writes the rest of its rows
//! ([`complete`]); a paused sweep's rows are written held, and its resume keeps the last job
//! held while chunks remain ([`hold_last_while_expanding`]); removal is refused while chunks
//! remain.

use super::backend::{on_conn, Conn, Engine};
use super::sql;
use shared::api::SweepId;
use shared::sweep::{JobSpec, Sweep};
use std::fmt::Write as _;

/// Jobs per INSERT statement: 5 bound values per job stays under SQLite's 32,766-variable
/// limit, and few statements is what makes many jobs insert fast.
const JOBS_PER_STATEMENT: usize = 4_000;
/// Jobs the submission of an expansion writes itself, besides the last.
const FIRST_JOBS: usize = JOBS_PER_STATEMENT;
/// Jobs per chunk of an expansion: a background unit of 5-10 ms, the most a claim waits for one.
const CHUNK_JOBS: usize = 2_000;
/// A sweep with more jobs than this is expanded after its submission (on SQLite); up to this
/// many are written in 50 ms or less.
const EXPAND_ABOVE: u64 = 20_000;
// An expansion has a chunk: only writing its last chunk releases the held last job.
const _: () = assert!(EXPAND_ABOVE > FIRST_JOBS as u64 + 1);

/// What every job of a sweep is inserted with besides its own index, params, command and config.
#[derive(Debug, Clone, PartialEq)]
pub struct Shared {
    gpus: Option<i64>,
    gpu_memory: Option<i64>,
    exclusive: Option<i64>,
    timeout_secs: Option<i64>,
    priority: i64,
    retries_left: i64,
    created_at: i64,
    needs_trainer: i64,
}

impl Shared {
    pub fn of(sweep: &Sweep, now: i64) -> Self {
        let resources = &sweep.resources;
        Shared {
            gpus: resources.gpus.map(i64::from),
            gpu_memory: resources.gpu_memory.map(|bytes| bytes as i64),
            exclusive: resources.exclusive.map(i64::from),
            timeout_secs: sweep.timeout_secs.map(|secs| secs as i64),
            priority: sweep.priority,
            retries_left: i64::from(sweep.retries),
            created_at: now,
            needs_trainer: i64::from(resources.trainer),
        }
    }
}

/// A sweep's rows made ready off the writer: rendered, and (a large sweep on SQLite) the rows
/// after the first chunk encoded as the chunks the background writes.
pub enum Prepared {
    /// Every job, rendered in the write unit as it is inserted.
    All,
    /// An expansion: the first chunk's jobs, the encoded chunks after it (each with its first
    /// job's position), the last job, and how many jobs there are in all.
    Expansion { first: Vec<JobSpec>, chunks: Vec<(usize, Vec<u8>)>, last: JobSpec, count: u64 },
}

impl Prepared {
    /// What the submission of `sweep` at `now` to a database of `engine` writes and leaves.
    /// CPU work (a 100,000-job sweep: tens of milliseconds): run it off the async executor.
    pub fn of(sweep: &Sweep, engine: Engine, now: i64) -> Prepared {
        if engine != Engine::Sqlite || sweep.count() <= EXPAND_ABOVE {
            return Prepared::All;
        }
        let shared = Shared::of(sweep, now);
        let mut jobs = sweep.jobs().peekable();
        let first: Vec<JobSpec> = jobs.by_ref().take(FIRST_JOBS).collect();
        // Streamed a chunk at a time: a million rendered jobs held at once cost more than twice
        // as much to make.
        let (mut chunks, mut batch, mut position) = (Vec::new(), Vec::with_capacity(CHUNK_JOBS), first.len());
        let last = loop {
            let Some(job) = jobs.next() else { break None };
            if jobs.peek().is_none() {
                break Some(job);
            }
            batch.push(job);
            if batch.len() == CHUNK_JOBS {
                chunks.push((position, encode(&shared, &batch)));
                position += batch.len();
                batch.clear();
            }
        };
        if !batch.is_empty() {
            chunks.push((position, encode(&shared, &batch)));
            position += batch.len();
        }
        let Some(last) = last else { return Prepared::All };
        Prepared::Expansion { first, chunks, last, count: position as u64 + 1 }
    }

    /// Whether [`Prepared::of`] may take long enough to go to a blocking thread.
    pub fn worth_a_thread(sweep: &Sweep) -> bool {
        sweep.count() > EXPAND_ABOVE
    }

    /// Whether rows are left for [`fill_next`].
    pub fn expanding(&self) -> bool {
        matches!(self, Prepared::Expansion { .. })
    }
}

/// Inserts every job of the sweep as queued and counts them: all of them now, or (an expansion)
/// the first chunk and the last job now and the rest as chunks for [`fill_next`]. Returns the
/// sweep's job count. `now` is the one `prepared` was made with.
pub async fn insert(
    conn: impl Into<Conn<'_>>,
    sweep_id: SweepId,
    sweep: &Sweep,
    prepared: &Prepared,
    now: i64,
) -> sql::Result<u64> {
    let mut conn = conn.into();
    let shared = Shared::of(sweep, now);
    let count = match prepared {
        Prepared::All => {
            let mut jobs = sweep.jobs().peekable();
            let mut batch = Vec::with_capacity(JOBS_PER_STATEMENT);
            let mut count = 0;
            while jobs.peek().is_some() {
                batch.clear();
                batch.extend(jobs.by_ref().take(JOBS_PER_STATEMENT));
                insert_rows(&mut conn, sweep_id, &shared, &batch, None).await?;
                count += batch.len() as u64;
            }
            count
        }
        Prepared::Expansion { first, chunks, last, count } => {
            let base = next_id(&mut conn).await?;
            insert_rows(&mut conn, sweep_id, &shared, first, Some(base)).await?;
            for (offset, rows) in chunks {
                store_chunk(&mut conn, sweep_id, (base + *offset as i64, shared.priority), rows).await?;
            }
            let count = *count;
            // The last job is written now, so that no other insert takes an id below it, and held
            // until the others are written.
            let last_id = base + count as i64 - 1;
            insert_rows(&mut conn, sweep_id, &shared, std::slice::from_ref(last), Some(last_id)).await?;
            hold(&mut conn, last_id).await?;
            count
        }
    };
    super::sweeps::count_new_jobs(&mut conn, sweep_id, count).await?;
    Ok(count)
}

/// Inserts proposed jobs of an adaptive sweep (queued, with the sweep's resources and settings)
/// and counts them.
pub async fn insert_proposed(
    conn: impl Into<Conn<'_>>,
    sweep_id: SweepId,
    sweep: &Sweep,
    jobs: &[JobSpec],
    now: i64,
) -> sql::Result<()> {
    let mut conn = conn.into();
    let shared = Shared::of(sweep, now);
    for batch in jobs.chunks(JOBS_PER_STATEMENT) {
        insert_rows(&mut conn, sweep_id, &shared, batch, None).await?;
    }
    super::sweeps::count_new_jobs(&mut conn, sweep_id, jobs.len() as u64).await
}

/// What [`fill_next`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filled {
    /// No chunk is left (but those of the sweeps skipped).
    Nothing,
    /// A chunk of this sweep was written.
    Wrote(SweepId),
    /// This sweep's next chunk cannot be written (it does not decode, or its rows are refused),
    /// and nothing of it was: why.
    Refused(SweepId, String),
}

/// Writes the next chunk of rows an expansion has left (the highest priority's, then the
/// oldest sweep's, then its first), skipping the sweeps in `skip`.
pub async fn fill_next(conn: impl Into<Conn<'_>>, skip: &[SweepId]) -> sql::Result<Filled> {
    let mut conn = conn.into();
    let skip = serde_json::to_string(skip).unwrap_or_else(|_| "[]".into());
    let next: Option<(i64, i64, Vec<u8>)> = on_conn!(conn, |conn, engine| {
        sql::query_as(&format!(
            "SELECT sweep_id, first_id, rows FROM job_expansions WHERE sweep_id NOT IN (SELECT {})
             ORDER BY priority DESC, sweep_id, first_id LIMIT 1",
            engine.json_ids(1)
        ))
        .bind(&skip)
        .fetch_optional(conn)
        .await
    })?;
    let Some((sweep_id, first_id, rows)) = next else { return Ok(Filled::Nothing) };
    let sweep_id = SweepId::new(sweep_id);
    // Refused before anything of the chunk is written (a failed statement changes nothing).
    let (shared, rows) = match decode_chunk(&rows) {
        Ok(decoded) => decoded,
        Err(error) => return Ok(Filled::Refused(sweep_id, error.to_string())),
    };
    if let Err(error) = insert_rows(&mut conn, sweep_id, &shared, &rows, Some(first_id)).await {
        return Ok(Filled::Refused(sweep_id, error.to_string()));
    }
    finish_chunk(&mut conn, sweep_id, first_id, rows.len()).await?;
    Ok(Filled::Wrote(sweep_id))
}

/// Writes every row the sweep's expansion has left (none, nearly always); how many.
pub async fn complete(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<u64> {
    let mut conn = conn.into();
    let mut written = 0;
    loop {
        let next: Option<(i64, Vec<u8>)> = on_conn!(conn, |conn, engine| {
            sql::query_as("SELECT first_id, rows FROM job_expansions WHERE sweep_id = $1 ORDER BY first_id LIMIT 1")
                .bind(sweep_id.get())
                .fetch_optional(conn)
                .await
        })?;
        let Some((first_id, rows)) = next else { return Ok(written) };
        let (shared, rows) = decode_chunk(&rows)?;
        insert_rows(&mut conn, sweep_id, &shared, &rows, Some(first_id)).await?;
        finish_chunk(&mut conn, sweep_id, first_id, rows.len()).await?;
        written += rows.len() as u64;
    }
}

/// The id SQLite would give the next row.
async fn next_id(conn: &mut Conn<'_>) -> sql::Result<i64> {
    on_conn!(conn, |conn, engine| {
        sql::query_scalar("SELECT coalesce(max(id), 0) + 1 FROM jobs").fetch_one(conn).await
    })
}

async fn store_chunk(
    conn: &mut Conn<'_>,
    sweep_id: SweepId,
    (first_id, priority): (i64, i64),
    rows: &[u8],
) -> sql::Result<()> {
    on_conn!(conn, |conn, engine| {
        sql::query("INSERT INTO job_expansions (sweep_id, first_id, priority, rows) VALUES ($1, $2, $3, $4)")
            .bind(sweep_id.get())
            .bind(first_id)
            .bind(priority)
            .bind(rows)
            .execute(conn)
            .await?;
        Ok(())
    })
}

async fn hold(conn: &mut Conn<'_>, id: i64) -> sql::Result<()> {
    on_conn!(conn, |conn, engine| {
        sql::query("UPDATE jobs SET held = 1 WHERE id = $1").bind(id).execute(conn).await?;
        Ok(())
    })
}

fn decode_chunk(encoded: &[u8]) -> sql::Result<(Shared, Vec<JobSpec>)> {
    decode(encoded).map_err(|why| sql::Error::Decode { column: "job_expansions.rows".into(), why: why.into() })
}

/// After a stored chunk's `count` rows were inserted: holds them if the sweep is paused, drops
/// the chunk, and after the sweep's last chunk releases its held last job (unless the sweep is
/// paused, which holds every queued job).
async fn finish_chunk(conn: &mut Conn<'_>, sweep_id: SweepId, first_id: i64, count: usize) -> sql::Result<()> {
    // The job after this chunk: the next chunk's first, or (after the last chunk) the last job.
    let after = first_id + count as i64;
    on_conn!(conn, |conn, engine| {
        let paused: bool =
            sql::query_scalar("SELECT EXISTS (SELECT 1 FROM sweeps WHERE id = $1 AND paused_at IS NOT NULL)")
                .bind(sweep_id.get())
                .fetch_one(&mut *conn)
                .await?;
        if paused {
            sql::query("UPDATE jobs SET held = 1 WHERE id >= $1 AND id < $2 AND status = 'queued'")
                .bind(first_id)
                .bind(after)
                .execute(&mut *conn)
                .await?;
        }
        sql::query("DELETE FROM job_expansions WHERE sweep_id = $1 AND first_id = $2")
            .bind(sweep_id.get())
            .bind(first_id)
            .execute(&mut *conn)
            .await?;
        let left: bool = sql::query_scalar("SELECT EXISTS (SELECT 1 FROM job_expansions WHERE sweep_id = $1)")
            .bind(sweep_id.get())
            .fetch_one(&mut *conn)
            .await?;
        if !left && !paused {
            sql::query("UPDATE jobs SET held = 0 WHERE id = $1 AND sweep_id = $2 AND status = 'queued' AND held = 1")
                .bind(after)
                .bind(sweep_id.get())
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    })
}

/// After a resume released the sweep's held jobs: holds its last job again while rows before it
/// are still to be written.
pub async fn hold_last_while_expanding(conn: impl Into<Conn<'_>>, sweep_id: SweepId) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "UPDATE jobs SET held = 1
             WHERE id = (SELECT max(id) FROM jobs WHERE sweep_id = $1) AND status = 'queued'
               AND EXISTS (SELECT 1 FROM job_expansions WHERE sweep_id = $2)",
        )
        .bind(sweep_id.get())
        .bind(sweep_id.get())
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// Inserts `rows` as queued jobs of the sweep in one statement, with ids from `first_id` up
/// when given.
async fn insert_rows(
    conn: &mut Conn<'_>,
    sweep_id: SweepId,
    shared: &Shared,
    rows: &[JobSpec],
    first_id: Option<i64>,
) -> sql::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    on_conn!(conn, |conn, engine| {
        // Values shared by the whole sweep are bound once; each row binds only its own. Every
        // SQLite parameter is an anonymous `?` (numbered ones are looked up by name); PostgreSQL
        // numbers its own (`$N`), at most 65,535 a statement.
        let per_row = if first_id.is_some() { 5 } else { 4 };
        let mut sql = String::with_capacity(400 + rows.len() * 24);
        let (id_column, id_value) = if first_id.is_some() { ("id, ", "column5, ") } else { ("", "") };
        let _ = write!(
            sql,
            "INSERT INTO jobs ({id_column}sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive,
                               timeout_secs, priority, retries_left, created_at, needs_trainer, owner) "
        );
        match engine {
            Engine::Sqlite => {
                let _ = write!(
                    sql,
                    "SELECT {id_value}?, column1, column2, column3, column4, ?, ?, ?, ?, ?, ?, ?, ?,
                            (SELECT owner FROM sweeps WHERE id = ?) FROM (VALUES "
                );
            }
            Engine::Postgres => {
                let _ = write!(
                    sql,
                    "SELECT {id_value}$1, column1, column2, column3, column4, $2, $3, $4, $5, $6, $7, $8, $9,
                            (SELECT owner FROM sweeps WHERE id = $10) FROM (VALUES "
                );
            }
        }
        for position in 0..rows.len() {
            if position > 0 {
                sql.push(',');
            }
            match engine {
                Engine::Sqlite if per_row == 5 => sql.push_str("(?,?,?,?,?)"),
                Engine::Sqlite => sql.push_str("(?,?,?,?)"),
                Engine::Postgres => {
                    sql.push('(');
                    for column in 0..per_row {
                        let _ =
                            write!(sql, "{}${}", if column > 0 { "," } else { "" }, 11 + position * per_row + column);
                    }
                    sql.push(')');
                }
            }
        }
        sql.push_str(") AS v");
        let mut query = sql::query(&sql)
            .bind(sweep_id.get())
            .bind(shared.gpus)
            .bind(shared.gpu_memory)
            .bind(shared.exclusive)
            .bind(shared.timeout_secs)
            .bind(shared.priority)
            .bind(shared.retries_left)
            .bind(shared.created_at)
            .bind(shared.needs_trainer)
            .bind(sweep_id.get());
        for (position, job) in rows.iter().enumerate() {
            query = query.bind(job.index as i64).bind(&job.params).bind(&job.command).bind(job.config.as_deref());
            if let Some(first_id) = first_id {
                query = query.bind(first_id + position as i64);
            }
        }
        query.execute(&mut *conn).await?;
        Ok(())
    })
}

/// A chunk's bytes: a version, the shared values, then each row (index, params, command,
/// config), integers little-endian, text as a 4-byte length and UTF-8.
fn encode(shared: &Shared, rows: &[JobSpec]) -> Vec<u8> {
    let size: usize = rows
        .iter()
        .map(|row| 24 + row.params.len() + row.command.len() + row.config.as_ref().map_or(0, String::len))
        .sum();
    let mut out = Vec::with_capacity(80 + size);
    out.push(VERSION);
    for value in [shared.gpus, shared.gpu_memory, shared.exclusive, shared.timeout_secs] {
        match value {
            Some(value) => {
                out.push(1);
                out.extend_from_slice(&value.to_le_bytes());
            }
            None => out.push(0),
        }
    }
    for value in [shared.priority, shared.retries_left, shared.created_at, shared.needs_trainer] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for row in rows {
        out.extend_from_slice(&row.index.to_le_bytes());
        for text in [Some(&row.params), Some(&row.command)] {
            put_text(&mut out, text);
        }
        match &row.config {
            Some(config) => {
                out.push(1);
                put_text(&mut out, Some(config));
            }
            None => out.push(0),
        }
    }
    out
}

const VERSION: u8 = 1;

fn put_text(out: &mut Vec<u8>, text: Option<&String>) {
    let text = text.map_or("", String::as_str);
    out.extend_from_slice(&(text.len() as u32).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn decode(bytes: &[u8]) -> Result<(Shared, Vec<JobSpec>), &'static str> {
    let mut input = Reader { bytes };
    if input.take(1)? != [VERSION] {
        return Err("an unknown encoding");
    }
    let mut optional = [None; 4];
    for value in &mut optional {
        *value = match input.take(1)?[0] {
            0 => None,
            _ => Some(input.int()?),
        };
    }
    let [gpus, gpu_memory, exclusive, timeout_secs] = optional;
    let shared = Shared {
        gpus,
        gpu_memory,
        exclusive,
        timeout_secs,
        priority: input.int()?,
        retries_left: input.int()?,
        created_at: input.int()?,
        needs_trainer: input.int()?,
    };
    let count = input.length()?;
    let mut rows = Vec::with_capacity(count.min(CHUNK_JOBS));
    for _ in 0..count {
        let index = input.int()? as u64;
        let params = input.text()?;
        let command = input.text()?;
        let config = match input.take(1)?[0] {
            0 => None,
            _ => Some(input.text()?),
        };
        rows.push(JobSpec { index, params, command, config });
    }
    if !input.bytes.is_empty() {
        return Err("bytes after the last row");
    }
    Ok((shared, rows))
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], &'static str> {
        if self.bytes.len() < count {
            return Err("cut short");
        }
        let (taken, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(taken)
    }

    fn int(&mut self) -> Result<i64, &'static str> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().map_err(|_| "cut short")?))
    }

    fn length(&mut self) -> Result<usize, &'static str> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().map_err(|_| "cut short")?) as usize)
    }

    fn text(&mut self) -> Result<String, &'static str> {
        let length = self.length()?;
        String::from_utf8(self.take(length)?.to_vec()).map_err(|_| "text that is not UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(index: u64, config: Option<&str>) -> JobSpec {
        JobSpec {
            index,
            params: format!("{{\"a\":{index}}}"),
            command: format!("true --a {index} é"),
            config: config.map(str::to_string),
        }
    }

    #[test]
    fn a_chunk_decodes_to_what_was_encoded() {
        let shared = Shared {
            gpus: Some(2),
            gpu_memory: None,
            exclusive: Some(1),
            timeout_secs: None,
            priority: -3,
            retries_left: 2,
            created_at: 1_764_000_000_000,
            needs_trainer: 1,
        };
        let rows = vec![job(7, None), job(8, Some("lr: 0.1\n")), job(9, Some(""))];
        let (decoded_shared, decoded_rows) = decode(&encode(&shared, &rows)).unwrap();
        assert_eq!(decoded_shared, shared);
        assert_eq!(decoded_rows, rows);
    }

    #[test]
    fn damaged_chunks_are_refused_not_misread() {
        let shared =
            Shared::of(&shared::sweep::Sweep::parse("command: x\ngrid: {a: [1]}", &Default::default()).unwrap(), 5);
        let bytes = encode(&shared, &[job(1, None), job(2, Some("c"))]);
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode(&longer).unwrap_err(), "bytes after the last row");
        let mut other = bytes;
        other[0] = 9;
        assert_eq!(decode(&other).unwrap_err(), "an unknown encoding");
    }
}
