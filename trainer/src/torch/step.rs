//! One optimizer step over the replicas: the batch is split across them (and into `grad_accum`
//! micro-batches), each replica runs forward and backward on its part with the loss weighted by
//! its share of the batch, the gradients are summed onto the master (replica 0), and one
//! optimizer step there is followed by copying the weights back to the other replicas. With
//! mean losses weighted by share, the summed gradient equals the full-batch gradient.

use super::amp::{unscale_and_check, Autocast};
use super::data::{Data, Dataset};
use super::device::Devices;
use super::loader::{Batch, Loader, LoaderOptions};
use super::model::Model;
use super::TrainError;
use crate::config::{Amp, OptimizerName, Task, TrainConfig};
use crate::scaler::{LossScaler, StepDecision};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Reduction, Tensor};

pub struct Replica {
    pub vs: nn::VarStore,
    pub model: Model,
    pub device: Device,
    variables: Vec<Tensor>,
}

pub struct Engine {
    pub replicas: Vec<Replica>,
    pub optimizer: nn::Optimizer,
    /// Present with `amp: fp16`.
    pub scaler: Option<LossScaler>,
    pub amp: Amp,
    pub cuda: bool,
    pub task: Task,
    pub grad_clip: f64,
    pub grad_accum: usize,
}

/// What one step left behind.
pub struct StepResult {
    /// The batch's mean loss, on the master device (read it rarely: reading syncs).
    pub loss: Tensor,
    pub applied: bool,
}

impl Engine {
    pub fn new(config: &TrainConfig, data: &Data, devices: &Devices) -> Result<Engine, TrainError> {
        let mut replicas = Vec::with_capacity(devices.replicas.len());
        for &device in &devices.replicas {
            // The same seed on every replica; the copy below makes them equal regardless.
            tch::manual_seed(config.seed as i64);
            let vs = nn::VarStore::new(device);
            let model = Model::new(&vs.root(), &config.model, &data.sample_shape, data.outputs);
            let variables = vs.trainable_variables();
            replicas.push(Replica { vs, model, device, variables });
        }
        let (master, others) = replicas.split_first_mut().expect("at least one replica");
        for replica in others {
            replica.vs.copy(&master.vs)?;
        }
        let optimizer = build_optimizer(config, &replicas[0].vs)?;
        let scaler = (config.amp == Amp::Fp16).then(|| LossScaler::new(&config.loss_scale));
        Ok(Engine {
            replicas,
            optimizer,
            scaler,
            amp: config.amp,
            cuda: devices.cuda,
            task: data.task,
            grad_clip: config.grad_clip,
            grad_accum: config.grad_accum,
        })
    }

    pub fn master(&self) -> &Replica {
        &self.replicas[0]
    }

    pub fn master_device(&self) -> Device {
        self.replicas[0].device
    }

    /// Forward, backward, reduce and (unless the loss scaler skips it) one optimizer step.
    pub fn step(&mut self, batch: &Batch) -> StepResult {
        let loss = self.accumulate(batch);
        let applied = self.apply();
        StepResult { loss, applied }
    }

    /// Forward and backward over the whole batch, leaving the full-batch gradient on the
    /// master. Returns the mean loss (unscaled).
    pub fn accumulate(&mut self, batch: &Batch) -> Tensor {
        let total = batch.len();
        let micro_batches = split_sizes(total, self.grad_accum);
        let mut loss_sum: Option<Tensor> = None;
        let mut start = 0;
        for size in micro_batches {
            let micro = narrow(batch, start, size);
            start += size;
            let losses = self.forward(&micro, total);
            self.backward(&losses);
            for (loss, weight) in losses {
                let weighted = loss.detach().to_device(self.master_device()) * weight;
                loss_sum = Some(match loss_sum {
                    Some(sum) => sum + weighted,
                    None => weighted,
                });
            }
        }
        self.reduce_gradients();
        loss_sum.unwrap_or_else(|| Tensor::zeros([], (Kind::Float, self.master_device())))
    }

    /// Each replica's part of `batch` (`total` is the full step's sample count): its mean loss
    /// and that part's share of the step.
    pub fn forward(&self, batch: &Batch, total: usize) -> Vec<(Tensor, f64)> {
        let parts = split_sizes(batch.len(), self.replicas.len());
        let mut start = 0;
        let mut losses = Vec::with_capacity(parts.len());
        for (replica, size) in self.replicas.iter().zip(parts) {
            if size == 0 {
                continue;
            }
            let part = narrow(batch, start, size).to_device(replica.device);
            start += size;
            let autocast = Autocast::enter(self.amp, self.cuda);
            let output = replica.model.forward(&part.x, true);
            let loss = loss(&output, &part.y, self.task, Reduction::Mean);
            drop(autocast);
            losses.push((loss, size as f64 / total as f64));
        }
        losses
    }

    /// Backward of each weighted (and, for fp16, scaled) part loss into its replica's grads.
    pub fn backward(&self, losses: &[(Tensor, f64)]) {
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        for (loss, weight) in losses {
            (loss * (weight * scale)).backward();
        }
    }

    /// Sums the other replicas' gradients onto the master's.
    pub fn reduce_gradients(&self) {
        let (master, others) = self.replicas.split_first().expect("at least one replica");
        if others.is_empty() {
            return;
        }
        tch::no_grad(|| {
            for (index, variable) in master.variables.iter().enumerate() {
                // The master always takes the first part of a batch, so its gradient exists.
                let mut sum = variable.grad();
                for replica in others {
                    let grad = replica.variables[index].grad();
                    if grad.defined() && sum.defined() {
                        let _ = sum.g_add_(&grad.to_device_(master.device, grad.kind(), true, false));
                    }
                }
            }
        });
    }

    /// Unscale and check (fp16), clip, step, zero every replica's gradients and copy the
    /// weights to the other replicas. `false` when the loss scaler skipped the step.
    pub fn apply(&mut self) -> bool {
        let decision = match &mut self.scaler {
            Some(scaler) => {
                let found = unscale_and_check(&self.replicas[0].variables, scaler.scale());
                scaler.update(found)
            }
            None => StepDecision::Apply,
        };
        if decision == StepDecision::Apply {
            if self.grad_clip > 0.0 {
                self.optimizer.clip_grad_norm(self.grad_clip);
            }
            self.optimizer.step();
        }
        self.optimizer.zero_grad();
        let (master, others) = self.replicas.split_first_mut().expect("at least one replica");
        for replica in others {
            for variable in &mut replica.variables {
                variable.zero_grad();
            }
            if decision == StepDecision::Apply {
                replica.vs.copy(&master.vs).expect("replicas share variable names");
            }
        }
        decision == StepDecision::Apply
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.optimizer.set_lr(lr);
    }

    /// Mean loss and accuracy (classification) or mean absolute error (regression) on the
    /// master, without gradients.
    pub fn evaluate(&self, data: &Dataset, options: LoaderOptions) -> Evaluation {
        let master = self.master();
        tch::no_grad(|| {
            let zero = || Tensor::zeros([], (Kind::Double, master.device));
            let (mut loss_sum, mut metric_sum) = (zero(), zero());
            for batch in Loader::sequential(data, options) {
                let batch = batch.to_device(master.device);
                let autocast = Autocast::enter(self.amp, self.cuda);
                let output = master.model.forward(&batch.x, false).to_kind(Kind::Float);
                drop(autocast);
                loss_sum += loss(&output, &batch.y, self.task, Reduction::Sum).to_kind(Kind::Double);
                metric_sum += match self.task {
                    Task::Classification => output.argmax(1, false).eq_tensor(&batch.y).sum(Kind::Double),
                    Task::Regression => (output.reshape([-1]) - &batch.y).abs().sum(Kind::Double),
                };
            }
            let count = data.len().max(1) as f64;
            let loss = loss_sum.double_value(&[]) / count;
            let metric = metric_sum.double_value(&[]) / count;
            match self.task {
                Task::Classification => Evaluation { loss, accuracy: Some(metric), mae: None },
                Task::Regression => Evaluation { loss, accuracy: None, mae: Some(metric) },
            }
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: Option<f64>,
    pub mae: Option<f64>,
}

pub fn loss(output: &Tensor, y: &Tensor, task: Task, reduction: Reduction) -> Tensor {
    let output = output.to_kind(Kind::Float);
    match task {
        Task::Classification => output.cross_entropy_loss::<Tensor>(y, None, reduction, -100, 0.0),
        Task::Regression => output.reshape([-1]).mse_loss(y, reduction),
    }
}

fn build_optimizer(config: &TrainConfig, vs: &nn::VarStore) -> Result<nn::Optimizer, TrainError> {
    let settings = &config.optimizer;
    let [beta1, beta2] = settings.betas;
    let optimizer =
        match settings.name {
            OptimizerName::Sgd => nn::Sgd {
                momentum: settings.momentum,
                dampening: 0.0,
                wd: settings.weight_decay,
                nesterov: settings.nesterov,
            }
            .build(vs, settings.lr)?,
            OptimizerName::Adam => nn::Adam { beta1, beta2, wd: settings.weight_decay, eps: 1e-8, amsgrad: false }
                .build(vs, settings.lr)?,
            OptimizerName::Adamw => nn::AdamW { beta1, beta2, wd: settings.weight_decay, eps: 1e-8, amsgrad: false }
                .build(vs, settings.lr)?,
        };
    Ok(optimizer)
}

/// `total` split into `parts` sizes as even as possible, larger first.
pub fn split_sizes(total: usize, parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    (0..parts).map(|index| total / parts + usize::from(index < total % parts)).collect()
}

fn narrow(batch: &Batch, start: usize, size: usize) -> Batch {
    if start == 0 && size == batch.len() {
        return Batch { x: batch.x.shallow_clone(), y: batch.y.shallow_clone() };
    }
    Batch { x: batch.x.narrow(0, start as i64, size as i64), y: batch.y.narrow(0, start as i64, size as i64) }
}
