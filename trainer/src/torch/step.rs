//! One optimizer step of this process's model. The process holds its rank's share of the
//! step's batch; it is cut into `grad_accum` micro-batches, each loss is weighted by its share
//! of the whole step (times the number of ranks, which the all-reduce averages over), so the
//! gradient every rank ends with is the full-batch mean gradient. With several ranks, c10d's
//! Reducer all-reduces the gradients in buckets during the last micro-batch's backward; the
//! earlier micro-batches accumulate locally (as `no_sync` does in PyTorch).

use super::amp::Autocast;
use super::data::{Data, Dataset};
use super::ffi::{self, ddp::ProcessGroup};
use super::loader::{Batch, Loader, LoaderOptions};
use super::model::Model;
use super::TrainError;
use crate::batches::{share, split_sizes};
use crate::config::{Amp, OptimizerName, Task, TrainConfig};
use crate::scaler::{LossScaler, StepDecision};
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Reduction, Tensor};

/// This process's place among the ranks.
pub struct Ddp {
    pub group: ProcessGroup,
    pub rank: usize,
    pub world: usize,
}

pub struct Engine {
    pub vs: nn::VarStore,
    pub model: Model,
    pub device: Device,
    /// Trainable parameters in definition order, and their state-dict names.
    params: Vec<Tensor>,
    param_names: Vec<String>,
    /// Batch norm running statistics (rank 0's are broadcast before each step).
    buffers: Vec<Tensor>,
    pub optimizer: nn::Optimizer,
    /// Present with `amp: fp16`.
    pub scaler: Option<LossScaler>,
    pub amp: Amp,
    pub cuda: bool,
    pub task: Task,
    pub grad_clip: f64,
    pub grad_accum: usize,
    /// Training forward passes so far (batch norm's `num_batches_tracked`).
    pub forward_passes: i64,
    ddp: Option<Ddp>,
}

/// What one step left behind.
pub struct StepResult {
    /// The summed per-row loss over this rank's rows, on the device (read it rarely: reading
    /// syncs).
    pub loss_sum: Tensor,
    pub applied: bool,
}

impl Engine {
    pub fn new(config: &TrainConfig, data: &Data, device: Device) -> Result<Engine, TrainError> {
        tch::manual_seed(config.seed as i64);
        let vs = nn::VarStore::new(device);
        let model = Model::new(&vs.root(), &config.model, &data.sample_shape, data.outputs);
        let named = vs.variables();
        let params = vs.trainable_variables();
        let name_of = |tensor: &Tensor| {
            named.iter().find(|(_, variable)| variable.data_ptr() == tensor.data_ptr()).map(|(name, _)| name.clone())
        };
        let param_names = params.iter().map(|tensor| name_of(tensor).unwrap_or_default()).collect();
        let buffers = model
            .state_names
            .iter()
            .filter(|name| name.ends_with(".running_mean") || name.ends_with(".running_var"))
            .filter_map(|name| named.get(name).map(Tensor::shallow_clone))
            .collect();
        let optimizer = build_optimizer(config, &vs)?;
        let scaler = (config.amp == Amp::Fp16).then(|| LossScaler::new(&config.loss_scale));
        Ok(Engine {
            vs,
            model,
            device,
            params,
            param_names,
            buffers,
            optimizer,
            scaler,
            amp: config.amp,
            cuda: device.is_cuda(),
            task: data.task,
            grad_clip: config.grad_clip,
            grad_accum: config.grad_accum,
            forward_passes: 0,
            ddp: None,
        })
    }

    /// Joins the ranks: every rank takes rank 0's weights and statistics, then the Reducer is
    /// built over the parameters.
    pub fn join(&mut self, ddp: Ddp, bucket_mb: usize) -> Result<(), TrainError> {
        let mut everything = self.params.iter().map(Tensor::shallow_clone).collect::<Vec<_>>();
        everything.extend(self.buffers.iter().map(Tensor::shallow_clone));
        ddp.group.broadcast(&everything).map_err(TrainError::Ddp)?;
        ddp.group.attach(&self.params, &self.param_names, bucket_mb << 20).map_err(TrainError::Ddp)?;
        self.ddp = Some(ddp);
        Ok(())
    }

    pub fn ranks(&self) -> (usize, usize) {
        self.ddp.as_ref().map_or((0, 1), |ddp| (ddp.rank, ddp.world))
    }

    pub fn params(&self) -> &[Tensor] {
        &self.params
    }

    /// Forward, backward (with the all-reduce) and, unless the loss scaler skips it, one
    /// optimizer step.
    pub fn step(&mut self, batch: &Batch) -> Result<StepResult, TrainError> {
        self.sync_buffers()?;
        let sizes = split_sizes(batch.len(), self.grad_accum);
        let last = sizes.len() - 1;
        let mut loss_sum = Tensor::zeros([], (Kind::Float, self.device));
        for (index, micro) in batch.pieces(&sizes).iter().enumerate() {
            let synchronise = index == last;
            if synchronise {
                self.ddp_call(ProcessGroup::prepare_forward)?;
            }
            let (mean, weight) = self.forward(micro);
            if synchronise {
                self.ddp_call(ProcessGroup::prepare_backward)?;
            }
            self.backward(&mean, weight)?;
            loss_sum += mean.detach().to_kind(Kind::Float) * micro.len() as f64;
        }
        let applied = self.apply()?;
        Ok(StepResult { loss_sum, applied })
    }

    /// A micro-batch's mean loss and its weight: its share of the step, times the ranks.
    pub fn forward(&mut self, micro: &Batch) -> (Tensor, f64) {
        let (_, world) = self.ranks();
        let autocast = Autocast::enter(self.amp, self.cuda);
        let output = self.model.forward(&micro.x, true);
        let mean = loss(&output, &micro.y, self.task, Reduction::Mean);
        drop(autocast);
        self.forward_passes += 1;
        (mean, micro.len() as f64 * world as f64 / micro.step_rows.max(1) as f64)
    }

    /// Backward of the weighted (and, for fp16, scaled) loss.
    pub fn backward(&self, mean: &Tensor, weight: f64) -> Result<(), TrainError> {
        let scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        (mean * (weight * scale)).f_backward().map_err(|error| self.collective_error(error))
    }

    /// Unscale and check (fp16), clip, step and zero the gradients. `false` when the loss
    /// scaler skipped the step.
    pub fn apply(&mut self) -> Result<bool, TrainError> {
        let decision = match &mut self.scaler {
            Some(scaler) => {
                let found = ffi::unscale_grads(&self.params, scaler.scale()).map_err(TrainError::Torch)?;
                scaler.update(found)
            }
            None => StepDecision::Apply,
        };
        let applied = decision == StepDecision::Apply;
        if applied {
            if self.grad_clip > 0.0 {
                ffi::clip_grad_norm(&self.params, self.grad_clip).map_err(TrainError::Torch)?;
            }
            self.optimizer.step();
        }
        self.optimizer.zero_grad();
        Ok(applied)
    }

    pub fn set_lr(&mut self, lr: f64) {
        self.optimizer.set_lr(lr);
    }

    /// Sums `tensor` over the ranks (a no-op alone).
    pub fn all_reduce_sum(&self, tensor: &Tensor) -> Result<(), TrainError> {
        self.ddp_call(|group| group.all_reduce_sum(tensor))
    }

    /// Rank 0's batch norm statistics everywhere (as DDP's `broadcast_buffers`).
    pub fn sync_buffers(&self) -> Result<(), TrainError> {
        if self.buffers.is_empty() {
            return Ok(());
        }
        self.ddp_call(|group| group.broadcast(&self.buffers))
    }

    fn ddp_call(&self, call: impl FnOnce(&ProcessGroup) -> Result<(), String>) -> Result<(), TrainError> {
        match &self.ddp {
            Some(ddp) => call(&ddp.group).map_err(TrainError::Ddp),
            None => Ok(()),
        }
    }

    /// A failed backward with several ranks is almost always a collective that failed.
    fn collective_error(&self, error: tch::TchError) -> TrainError {
        let message = super::first_line(&error.to_string());
        if self.ddp.is_some() {
            TrainError::Ddp(message)
        } else {
            TrainError::Torch(message)
        }
    }

    /// Mean loss and accuracy (classification) or mean absolute error (regression) over
    /// `data`, without gradients; each rank evaluates its shard and the sums are all-reduced.
    pub fn evaluate(&self, data: &Dataset, batch_size: usize) -> Result<Evaluation, TrainError> {
        self.sync_buffers()?;
        let (rank, world) = self.ranks();
        let shard = data.slice(share(data.len(), world, rank));
        let sums = tch::no_grad(|| {
            let mut sums = Tensor::zeros([2], (Kind::Double, self.device));
            for batch in Loader::sequential(&shard, LoaderOptions::single(batch_size, self.device)) {
                let autocast = Autocast::enter(self.amp, self.cuda);
                let output = self.model.forward(&batch.x, false).to_kind(Kind::Float);
                drop(autocast);
                let loss_sum = loss(&output, &batch.y, self.task, Reduction::Sum).to_kind(Kind::Double);
                let metric_sum = match self.task {
                    Task::Classification => output.argmax(1, false).eq_tensor(&batch.y).sum(Kind::Double),
                    Task::Regression => (output.reshape([-1]) - &batch.y).abs().sum(Kind::Double),
                };
                sums += Tensor::stack(&[loss_sum, metric_sum], 0);
            }
            sums
        });
        self.all_reduce_sum(&sums)?;
        let count = data.len().max(1) as f64;
        let (loss, metric) = (sums.double_value(&[0]) / count, sums.double_value(&[1]) / count);
        Ok(match self.task {
            Task::Classification => Evaluation { loss, accuracy: Some(metric), mae: None },
            Task::Regression => Evaluation { loss, accuracy: None, mae: Some(metric) },
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
