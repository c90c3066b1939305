//! Background batch assembly: worker threads gather the rows of their batches (batch k goes to
//! thread k mod threads), pin them in page-locked memory when the target is a GPU, and queue up
//! to `prefetch` ready batches each; the training thread takes them in order and copies them
//! to the device without blocking. Without a GPU the batches are gathered inline instead.

use super::data::Dataset;
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;
use tch::{Device, Kind, Tensor};

pub struct Batch {
    pub x: Tensor,
    pub y: Tensor,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.x.size()[0] as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Onto `device`; a pinned source lets the copy overlap with compute.
    pub fn to_device(&self, device: Device) -> Batch {
        if device == Device::Cpu {
            return Batch { x: self.x.shallow_clone(), y: self.y.shallow_clone() };
        }
        Batch {
            x: self.x.to_device_(device, self.x.kind(), true, false),
            y: self.y.to_device_(device, self.y.kind(), true, false),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct LoaderOptions {
    pub batch_size: usize,
    pub threads: usize,
    pub prefetch: usize,
    /// Pin batches for this CUDA device (ignored on the CPU).
    pub pin_for: Option<Device>,
}

/// One pass over the batches listed by `rows`; dropping it stops the threads.
pub struct Loader {
    /// On a CPU run the batches are gathered on the calling thread: the computation already
    /// uses every core, and loader threads would only take cores from it.
    inline: Option<Inline>,
    queues: Vec<Receiver<Batch>>,
    next: usize,
    remaining: usize,
    threads: Vec<JoinHandle<()>>,
}

impl Loader {
    /// An epoch in a fresh random order (the global seed decides it).
    pub fn shuffled(data: &Dataset, options: LoaderOptions) -> Loader {
        let order = Tensor::randperm(data.len() as i64, (Kind::Int64, Device::Cpu));
        Loader::over(data, order, options)
    }

    /// In order, for evaluation.
    pub fn sequential(data: &Dataset, options: LoaderOptions) -> Loader {
        let order = Tensor::arange(data.len() as i64, (Kind::Int64, Device::Cpu));
        Loader::over(data, order, options)
    }

    /// `count` batches of random rows (with replacement), for benchmarks whose batch may be
    /// larger than the dataset.
    pub fn random(data: &Dataset, count: usize, options: LoaderOptions) -> Loader {
        let rows = (count * options.batch_size) as i64;
        let order = Tensor::randint(data.len() as i64, [rows], (Kind::Int64, Device::Cpu));
        Loader::over(data, order, options)
    }

    fn over(data: &Dataset, order: Tensor, options: LoaderOptions) -> Loader {
        let total = order.size()[0];
        let batch = options.batch_size.max(1) as i64;
        let batches = ((total + batch - 1) / batch) as usize;
        if options.pin_for.is_none_or(|device| !device.is_cuda()) {
            let inline = Inline { x: data.x.shallow_clone(), y: data.y.shallow_clone(), order, batch, total, next: 0 };
            return Loader {
                inline: Some(inline),
                queues: Vec::new(),
                next: 0,
                remaining: batches,
                threads: Vec::new(),
            };
        }
        let threads = options.threads.clamp(1, batches.max(1));
        let mut queues = Vec::with_capacity(threads);
        let mut handles = Vec::with_capacity(threads);
        for thread in 0..threads {
            let (sender, receiver) = sync_channel::<Batch>(options.prefetch.max(1));
            let (x, y, order) = (data.x.shallow_clone(), data.y.shallow_clone(), order.shallow_clone());
            let pin = options.pin_for.filter(|device| device.is_cuda());
            let handle = std::thread::Builder::new()
                .name(format!("loader-{thread}"))
                .spawn(move || {
                    for index in (thread..batches).step_by(threads) {
                        let start = index as i64 * batch;
                        let rows = order.narrow(0, start, batch.min(total - start));
                        let (mut bx, mut by) = (x.index_select(0, &rows), y.index_select(0, &rows));
                        if let Some(device) = pin {
                            bx = bx.pin_memory(device);
                            by = by.pin_memory(device);
                        }
                        // The receiver is gone when the epoch ended early: stop quietly.
                        if sender.send(Batch { x: bx, y: by }).is_err() {
                            return;
                        }
                    }
                })
                .expect("spawning a loader thread");
            queues.push(receiver);
            handles.push(handle);
        }
        Loader { inline: None, queues, next: 0, remaining: batches, threads: handles }
    }
}

impl Iterator for Loader {
    type Item = Batch;

    fn next(&mut self) -> Option<Batch> {
        if self.remaining == 0 {
            return None;
        }
        if let Some(inline) = &mut self.inline {
            self.remaining -= 1;
            let start = inline.next;
            inline.next += inline.batch;
            let rows = inline.order.narrow(0, start, inline.batch.min(inline.total - start));
            return Some(Batch { x: inline.x.index_select(0, &rows), y: inline.y.index_select(0, &rows) });
        }
        let Ok(batch) = self.queues[self.next].recv() else {
            // The thread ended before its batches did: it panicked (a libtorch error, such as
            // running out of memory). Raise its panic here, where the caller can catch it.
            let thread = self.threads.remove(self.next);
            if let Err(payload) = thread.join() {
                std::panic::resume_unwind(payload);
            }
            return None;
        };
        self.next = (self.next + 1) % self.queues.len();
        self.remaining -= 1;
        Some(batch)
    }
}

struct Inline {
    x: Tensor,
    y: Tensor,
    order: Tensor,
    batch: i64,
    total: i64,
    next: i64,
}

impl Drop for Loader {
    fn drop(&mut self) {
        self.queues.clear();
        for handle in self.threads.drain(..) {
            let _ = handle.join();
        }
    }
}
