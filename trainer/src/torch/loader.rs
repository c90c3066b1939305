//! Batches of an epoch, as this rank's share of each step, delivered on the training device.
//!
//! Where the rows are gathered depends on where the data lives:
//! - on the training device (a CPU run, or a dataset small enough to live on the GPU): on the
//!   calling thread, straight from the device tensors; no copies beyond the gather;
//! - on the host for a GPU run: worker threads (batch k goes to thread k mod threads) gather
//!   each batch straight into page-locked memory (one host copy), and the training thread copies
//!   it to the GPU on a side stream one batch ahead, so the copy overlaps with the compute of
//!   the batch before it.
//!
//! Every step's rows come from `batches::epoch_batches`, so no rank ever gets a piece too
//! small to train on.

use super::data::Dataset;
use super::ffi::{self, PendingCopy};
use super::TrainError;
use crate::batches::{epoch_batches, share};
use std::ops::Range;
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;
use tch::{Device, Kind, Tensor};

pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
    /// Rows of the whole step over all ranks (this batch is one rank's share of them).
    pub step_rows: usize,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.x.size()[0] as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn narrow(&self, start: usize, len: usize) -> Batch {
        Batch {
            x: self.x.narrow(0, start as i64, len as i64),
            y: self.y.narrow(0, start as i64, len as i64),
            step_rows: self.step_rows,
        }
    }

    /// Cuts the batch into `sizes` consecutive pieces (micro-batches).
    pub fn pieces(&self, sizes: &[usize]) -> Vec<Batch> {
        let mut start = 0;
        sizes
            .iter()
            .map(|&size| {
                let piece = self.narrow(start, size);
                start += size;
                piece
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LoaderOptions {
    pub batch_size: usize,
    pub threads: usize,
    pub prefetch: usize,
    /// The training device; batches arrive there.
    pub device: Device,
    /// Page-locked host batches for a CUDA device (when the data is on the host).
    pub pin_memory: bool,
    pub rank: usize,
    pub ranks: usize,
    /// The fewest rows a step may have (a shorter last batch joins the one before it).
    pub min_step_rows: usize,
}

impl LoaderOptions {
    /// One process, no minimum beyond a row: evaluation and single-device use.
    pub fn single(batch_size: usize, device: Device) -> LoaderOptions {
        LoaderOptions {
            batch_size,
            threads: 1,
            prefetch: 2,
            device,
            pin_memory: false,
            rank: 0,
            ranks: 1,
            min_step_rows: 1,
        }
    }
}

/// One pass over the data; dropping it stops the threads.
pub struct Loader {
    source: Source,
    remaining: usize,
    device: Device,
    /// The next batch, already being copied to the GPU.
    ahead: Option<(PendingCopy, PendingCopy, usize)>,
}

enum Source {
    /// Gathered on the calling thread from tensors on the training device.
    Inline { x: Tensor, y: Tensor, order: Tensor, steps: std::vec::IntoIter<(Range<usize>, usize)> },
    /// Gathered by worker threads on the host.
    Threads { queues: Vec<Receiver<Batch>>, next: usize, threads: Vec<JoinHandle<()>> },
}

impl Loader {
    /// An epoch in a fresh random order (the global seed decides it, the same on every rank).
    pub fn shuffled(data: &Dataset, options: LoaderOptions) -> Result<Loader, TrainError> {
        let order = Tensor::randperm(data.len() as i64, (Kind::Int64, Device::Cpu));
        let batches = epoch_batches(data.len(), options.batch_size, options.min_step_rows)?;
        Ok(Loader::over(data, order, batches, options))
    }

    /// In order, for evaluation (of this rank's shard, which the caller cuts).
    pub fn sequential(data: &Dataset, options: LoaderOptions) -> Loader {
        let order = Tensor::arange(data.len() as i64, (Kind::Int64, Device::Cpu));
        let batch = options.batch_size.max(1);
        let batches = (0..data.len()).step_by(batch).map(|start| start..(start + batch).min(data.len())).collect();
        Loader::over(data, order, batches, LoaderOptions { ranks: 1, rank: 0, ..options })
    }

    /// `count` steps of random rows (with replacement), for benchmarks whose batch may be
    /// larger than the dataset.
    pub fn random(data: &Dataset, count: usize, options: LoaderOptions) -> Loader {
        let batch = options.batch_size.max(1);
        let order = Tensor::randint(data.len() as i64, [(count * batch) as i64], (Kind::Int64, Device::Cpu));
        let batches = (0..count).map(|index| index * batch..(index + 1) * batch).collect();
        Loader::over(data, order, batches, options)
    }

    fn over(data: &Dataset, order: Tensor, batches: Vec<Range<usize>>, options: LoaderOptions) -> Loader {
        // Each step's range, narrowed to this rank's share; and the step's full row count.
        let steps: Vec<(Range<usize>, usize)> = batches
            .into_iter()
            .map(|batch| {
                let mine = share(batch.len(), options.ranks, options.rank);
                (batch.start + mine.start..batch.start + mine.end, batch.len())
            })
            .collect();
        let remaining = steps.len();
        let data_device = data.x.device();
        let source = if data_device == options.device || !options.device.is_cuda() {
            let order = order.to_device(data_device);
            Source::Inline { x: data.x.shallow_clone(), y: data.y.shallow_clone(), order, steps: steps.into_iter() }
        } else {
            threaded(data, order, steps, options)
        };
        Loader { source, remaining, device: options.device, ahead: None }
    }

    /// The next host batch from the threads, or the next inline one.
    fn produce(&mut self) -> Option<Batch> {
        match &mut self.source {
            Source::Inline { x, y, order, steps } => {
                let (range, step_rows) = steps.next()?;
                let rows = order.narrow(0, range.start as i64, range.len() as i64);
                Some(Batch { x: x.index_select(0, &rows), y: y.index_select(0, &rows), step_rows })
            }
            Source::Threads { queues, next, threads } => {
                if queues.is_empty() {
                    return None;
                }
                let Ok(batch) = queues[*next].recv() else {
                    // The thread ended before its batches did: it panicked (a libtorch error,
                    // such as running out of memory). Raise its panic here, where the caller
                    // can catch it.
                    let thread = threads.remove(*next);
                    if let Err(payload) = thread.join() {
                        std::panic::resume_unwind(payload);
                    }
                    return None;
                };
                *next = (*next + 1) % queues.len();
                Some(batch)
            }
        }
    }

    /// Starts the next host batch's copy to the GPU.
    fn send_ahead(&mut self) -> Result<(), TrainError> {
        let Device::Cuda(index) = self.device else { return Ok(()) };
        if let Some(batch) = self.produce() {
            let x = ffi::copy_to_cuda(&batch.x, index).map_err(TrainError::Torch)?;
            let y = ffi::copy_to_cuda(&batch.y, index).map_err(TrainError::Torch)?;
            self.ahead = Some((x, y, batch.step_rows));
        }
        Ok(())
    }

    fn next_batch(&mut self) -> Result<Option<Batch>, TrainError> {
        if self.remaining == 0 {
            return Ok(None);
        }
        self.remaining -= 1;
        if matches!(self.source, Source::Inline { .. }) {
            return Ok(self.produce());
        }
        if self.ahead.is_none() {
            self.send_ahead()?;
        }
        let Some((x, y, step_rows)) = self.ahead.take() else { return Ok(None) };
        // The following batch starts copying before this one is handed out.
        if self.remaining > 0 {
            self.send_ahead()?;
        }
        let x = x.finish().map_err(TrainError::Torch)?;
        let y = y.finish().map_err(TrainError::Torch)?;
        Ok(Some(Batch { x, y, step_rows }))
    }
}

impl Iterator for Loader {
    type Item = Batch;

    /// Panics on a failed copy, as tch does on libtorch errors; the epoch loop catches it.
    fn next(&mut self) -> Option<Batch> {
        self.next_batch().unwrap_or_else(|error| panic!("{error}"))
    }
}

fn threaded(data: &Dataset, order: Tensor, steps: Vec<(Range<usize>, usize)>, options: LoaderOptions) -> Source {
    let count = steps.len();
    let threads = options.threads.clamp(1, count.max(1));
    let mut queues = Vec::with_capacity(threads);
    let mut handles = Vec::with_capacity(threads);
    for thread in 0..threads {
        let (sender, receiver) = sync_channel::<Batch>(options.prefetch.max(1));
        let (x, y, order) = (data.x.shallow_clone(), data.y.shallow_clone(), order.shallow_clone());
        let mine: Vec<(Range<usize>, usize)> = steps.iter().skip(thread).step_by(threads).cloned().collect();
        let pin = options.pin_memory;
        let handle = std::thread::Builder::new()
            .name(format!("loader-{thread}"))
            .spawn(move || {
                // Each thread gathers with one OpenMP thread: together they stay within the
                // loader threads asked for instead of each using every core.
                ffi::set_thread_omp_threads(1);
                for (range, step_rows) in mine {
                    let rows = order.narrow(0, range.start as i64, range.len() as i64);
                    let (bx, by) = (gather(&x, &rows, pin), gather(&y, &rows, pin));
                    // The receiver is gone when the epoch ended early: stop quietly.
                    if sender.send(Batch { x: bx, y: by, step_rows }).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning a loader thread");
        queues.push(receiver);
        handles.push(handle);
    }
    Source::Threads { queues, next: 0, threads: handles }
}

/// The rows of `source`, gathered straight into page-locked memory when asked (and possible).
fn gather(source: &Tensor, rows: &Tensor, pin: bool) -> Tensor {
    if pin {
        if let Ok(pinned) = ffi::empty_pinned(source, rows.size()[0]) {
            return source.index_select_out(&pinned, 0, rows);
        }
    }
    source.index_select(0, rows)
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.ahead = None;
        if let Source::Threads { queues, threads, .. } = &mut self.source {
            queues.clear();
            for handle in threads.drain(..) {
                let _ = handle.join();
            }
        }
    }
}
