//! The models: an MLP (hidden widths, activation, dropout, optional batch norm) and a small CNN
//! (3x3 convolution blocks with 2x2 max pooling, then an MLP head). Layers are named as a
//! PyTorch module with the same attributes would name them (`fc0`, `bn0`, `conv0`, `conv_bn0`,
//! `out`), so the weights save as a state dict with PyTorch's keys (`fc0.weight`).

use crate::config::{Activation, ModelConfig, ModelName};
use tch::nn::{self, ModuleT};
use tch::Tensor;

#[derive(Debug)]
pub struct Model {
    body: nn::SequentialT,
    /// The state dict's keys in module order (batch norm layers add `num_batches_tracked`).
    pub state_names: Vec<String>,
    /// The batch norm layers' names (each has a `num_batches_tracked`).
    pub batch_norms: Vec<String>,
}

impl Model {
    pub fn new(path: &nn::Path, config: &ModelConfig, sample_shape: &[i64], outputs: i64) -> Model {
        let mut body = nn::seq_t();
        let mut names = Names::default();
        let mut width: i64 = sample_shape.iter().product();
        if config.name == ModelName::Cnn {
            let (mut channels, mut height, mut width_px) = image_shape(sample_shape);
            let shape = [-1, channels, height, width_px];
            body = body.add_fn(move |x| x.reshape(shape));
            for (block, &out) in config.channels.iter().enumerate() {
                let out = out as i64;
                let name = names.layer(format!("conv{block}"));
                let conv =
                    nn::conv2d(path / name, channels, out, 3, nn::ConvConfig { padding: 1, ..Default::default() });
                body = body.add(conv);
                if config.batch_norm {
                    let name = names.batch_norm(format!("conv_bn{block}"));
                    body = body.add(nn::batch_norm2d(path / name, out, Default::default()));
                }
                body = body.add_fn(activation(config.activation));
                if height >= 2 && width_px >= 2 {
                    body = body.add_fn(|x| x.max_pool2d_default(2));
                    height /= 2;
                    width_px /= 2;
                }
                channels = out;
            }
            width = channels * height * width_px;
        }
        body = body.add_fn(|x| x.flatten(1, -1));
        for (layer, &hidden) in config.hidden_dims.iter().enumerate() {
            let hidden = hidden as i64;
            let name = names.layer(format!("fc{layer}"));
            body = body.add(nn::linear(path / name, width, hidden, Default::default()));
            if config.batch_norm {
                let name = names.batch_norm(format!("bn{layer}"));
                body = body.add(nn::batch_norm1d(path / name, hidden, Default::default()));
            }
            body = body.add_fn(activation(config.activation));
            if config.dropout > 0.0 {
                let rate = config.dropout;
                body = body.add_fn_t(move |x, train| x.dropout(rate, train));
            }
            width = hidden;
        }
        let name = names.layer("out".to_string());
        body = body.add(nn::linear(path / name, width, outputs, Default::default()));
        Model { body, state_names: names.state, batch_norms: names.batch_norms }
    }

    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.body.forward_t(x, train)
    }
}

#[derive(Default)]
struct Names {
    state: Vec<String>,
    batch_norms: Vec<String>,
}

impl Names {
    fn layer(&mut self, name: String) -> String {
        self.state.extend(["weight", "bias"].map(|part| format!("{name}.{part}")));
        name
    }

    fn batch_norm(&mut self, name: String) -> String {
        let parts = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"];
        self.state.extend(parts.map(|part| format!("{name}.{part}")));
        self.batch_norms.push(name.clone());
        name
    }
}

fn image_shape(shape: &[i64]) -> (i64, i64, i64) {
    match *shape {
        [c, h, w] => (c, h, w),
        [h, w] => (1, h, w),
        // Tabular rows as a one-pixel-high image with one channel.
        [n] => (1, 1, n),
        _ => (1, 1, shape.iter().product()),
    }
}

fn activation(kind: Activation) -> impl Fn(&Tensor) -> Tensor + Send + 'static {
    move |x: &Tensor| match kind {
        Activation::Relu => x.relu(),
        Activation::Gelu => x.gelu("none"),
        Activation::Tanh => x.tanh(),
        Activation::Silu => x.silu(),
    }
}
