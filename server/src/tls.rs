//! HTTPS: a listener that completes the TLS handshake before handing connections to
//! `axum::serve`, so HTTP and HTTPS share one serving path (and its graceful shutdown).
//! Handshakes run in their own tasks with a timeout: a slow or silent client cannot hold up
//! the accept loop.

use crate::config::TlsFiles;
use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at most: the connections they hold are not yet under the serving
/// loop's caps (`serve`), so they are bounded here; past it, new connections wait in the
/// listen backlog until one ends (within the handshake timeout).
const MAX_HANDSHAKES: usize = 512;

/// Reads the PEM certificate chain and key; errors name the file and what is wrong with it.
pub fn server_config(files: &TlsFiles) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let certs = CertificateDer::pem_file_iter(&files.cert)
        .with_context(|| format!("reading the TLS certificate {}", files.cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("parsing the TLS certificate {} (PEM expected)", files.cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "the TLS certificate file {} has no certificate in it", files.cert.display());
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .with_context(|| format!("reading the TLS key {} (a PEM private key expected)", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!("the key {} does not fit the certificate {}", files.key.display(), files.cert.display())
        })?;
    // The server speaks HTTP/1.1 only (axum's http1 feature).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

pub struct TlsListener {
    handshaken: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (ready, handshaken) = mpsc::channel(64);
        tokio::spawn(accept_loop(listener, TlsAcceptor::from(config), ready));
        Ok(TlsListener { handshaken, local })
    }
}

/// Accepts until the server stops (the receiver is dropped), which also closes the socket.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let permit = tokio::select! {
            permit = handshakes.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
            _ = ready.closed() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = ready.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors, say: back off instead of spinning.
                tracing::warn!(%error, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (acceptor, ready) = (acceptor.clone(), ready.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
            drop(permit);
            match handshake {
                Ok(Ok(tls)) => {
                    // The serving loop takes it when it has room (it waits while every
                    // connection answers a request); a connection no one takes in time goes.
                    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, ready.send((tls, peer))).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(connection) => connection,
            // The accept loop only ends once this listener is gone; never reached.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
