"""A VAE (the flax VAE example's shape): encoder and decoder, a noise stream, `generate`."""

import flax.linen as nn
import jax
import jax.numpy as jnp


class Encoder(nn.Module):
  latents: int

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(32, name="fc1")(x)
    x = nn.relu(x)
    mean_x = nn.Dense(self.latents, name="fc2_mean")(x)
    logvar_x = nn.Dense(self.latents, name="fc2_logvar")(x)
    return mean_x, logvar_x


class Decoder(nn.Module):
  out_features: int

  @nn.compact
  def __call__(self, z):
    z = nn.Dense(32, name="fc1")(z)
    z = nn.relu(z)
    return nn.Dense(self.out_features, name="fc2")(z)


def reparameterize(rng, mean, logvar):
  std = jnp.exp(0.5 * logvar)
  eps = jax.random.normal(rng, logvar.shape)
  return mean + eps * std


class VAE(nn.Module):
  """Encode, sample a latent from the 'noise' stream, decode; `generate` decodes given latents."""

  latents: int = 8
  out_features: int = 24

  def setup(self):
    self.encoder = Encoder(self.latents)
    self.decoder = Decoder(self.out_features)

  def __call__(self, x, deterministic: bool = False):
    mean, logvar = self.encoder(x)
    # At evaluation the posterior mean stands in for a sample.
    z = mean if deterministic else reparameterize(self.make_rng("noise"), mean, logvar)
    recon_x = self.decoder(z)
    return recon_x, mean, logvar

  def generate(self, z):
    return nn.sigmoid(self.decoder(z))


model = VAE()


def sample_args():
  return (jax.random.uniform(jax.random.key(4), (3, 24), jnp.float32),)


def latents():
  return (jax.random.normal(jax.random.key(5), (3, 8), jnp.float32),)


SAMPLE_KWARGS = {"deterministic": True}
EXTRA_CALLS = (("generate", latents, {}),)
