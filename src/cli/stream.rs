//! `run - --stream`: stdin as a stream of chunks, each as it arrives.

use std::io::Read;

use futures::Stream;

/// Stdin's bytes, a chunk per read as they arrive (read on a thread of its own); a read error
/// ends the stream with that error, which cuts the run off.
pub(crate) fn stdin_chunks() -> impl Stream<Item = Result<Vec<u8>, String>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, String>>(64);
    let on_failure = tx.clone();
    let spawned = std::thread::Builder::new()
        .name("toolscript-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buffer = vec![0u8; 16 << 10];
            loop {
                let chunk = match stdin.read(&mut buffer) {
                    Ok(0) => return,
                    Ok(n) => Ok(buffer[..n].to_vec()),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(format!("cannot read the script from stdin: {e}")),
                };
                let failed = chunk.is_err();
                if tx.blocking_send(chunk).is_err() || failed {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        let _ = on_failure.try_send(Err(format!("cannot start the thread reading stdin: {e}")));
    }
    drop(on_failure);
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| (chunk, rx))
    })
}
