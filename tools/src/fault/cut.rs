//! A network partition between one `leasekeeper serve` instance and its
//! database: a TCP relay the instance connects to instead of the database,
//! which the harness can cut and heal.
//!
//! A cut behaves like a link that silently stops carrying packets, not like
//! a refused connection: nothing is closed and no error is returned. Bytes
//! already sent stay where they are (in the relay or the kernel's buffers)
//! and arrive when the link heals, followed by any close that came after
//! them. So a write the cut-off instance sent before it noticed anything
//! reaches the database *late*, after its lease has run out and someone
//! else holds the resource: the write the fencing token must refuse. New
//! connections made during a cut hang the same way until it heals.

use std::path::PathBuf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where the relay forwards to.
#[derive(Clone, Debug)]
pub enum Upstream {
    Tcp(String),
    Unix(PathBuf),
}

/// The relay of one instance; stops when dropped.
pub struct Cut {
    pub port: u16,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Drop for Cut {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Cut {
    /// Starts a relay on a free local port, forwarding to `upstream`.
    pub async fn start(upstream: Upstream) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (cut, watch) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, watch) = (upstream.clone(), watch.clone());
                tokio::spawn(async move {
                    let _ = relay(client, upstream, watch).await;
                });
            }
        });
        Ok(Cut { port, cut, task })
    }

    /// Cuts the link: from now on nothing passes either way.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Heals it: everything held back passes, in order.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

async fn relay(
    client: TcpStream,
    upstream: Upstream,
    mut link: watch::Receiver<bool>,
) -> std::io::Result<()> {
    // A connection opened during a cut waits for the heal before it even
    // reaches the database.
    let _ = link.wait_for(|cut| !cut).await;
    client.set_nodelay(true)?;
    let (cr, cw) = client.into_split();
    match upstream {
        Upstream::Tcp(addr) => {
            let server = TcpStream::connect(addr).await?;
            server.set_nodelay(true)?;
            let (sr, sw) = server.into_split();
            pump_both(cr, cw, sr, sw, link).await
        }
        Upstream::Unix(path) => {
            let (sr, sw) = UnixStream::connect(path).await?.into_split();
            pump_both(cr, cw, sr, sw, link).await
        }
    }
}

async fn pump_both<CR, CW, SR, SW>(
    cr: CR,
    cw: CW,
    sr: SR,
    sw: SW,
    link: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    SR: AsyncRead + Unpin,
    SW: AsyncWrite + Unpin,
{
    let _ = tokio::join!(pump(cr, sw, link.clone()), pump(sr, cw, link));
    Ok(())
}

/// Copies `from` to `to` while the link is up. A read pending when the
/// link goes down is abandoned (reads are cancel-safe: nothing is lost);
/// bytes read just before are held until it comes back.
async fn pump<R, W>(mut from: R, mut to: W, mut link: watch::Receiver<bool>) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let _ = link.wait_for(|cut| !cut).await;
        let n = tokio::select! {
            read = from.read(&mut buf) => read?,
            _ = link.wait_for(|cut| *cut) => continue,
        };
        let _ = link.wait_for(|cut| !cut).await;
        if n == 0 {
            let _ = to.shutdown().await;
            return Ok(());
        }
        to.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server; answers its port.
    async fn echo() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_cut_holds_bytes_back_and_the_heal_delivers_them_in_order() {
        let cut = Cut::start(Upstream::Tcp(echo().await)).await.unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", cut.port)).await.unwrap();
        let mut got = [0u8; 3];
        s.write_all(b"one").await.unwrap();
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"one");

        cut.cut();
        s.write_all(b"two").await.unwrap();
        let waited = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut got)).await;
        assert!(waited.is_err(), "bytes crossed a cut link");

        // A connection opened during the cut hangs too.
        let mut late = TcpStream::connect(("127.0.0.1", cut.port)).await.unwrap();
        late.write_all(b"new").await.unwrap();

        cut.heal();
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got))
            .await
            .expect("delivered after the heal")
            .unwrap();
        assert_eq!(&got, b"two");
        tokio::time::timeout(Duration::from_secs(5), late.read_exact(&mut got))
            .await
            .expect("the late connection works after the heal")
            .unwrap();
        assert_eq!(&got, b"new");
    }
}
