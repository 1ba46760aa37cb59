//! Tests of `body`: in a file of their own so that their `use super::*`
//! names this module (tools that read imports by file take a nested test
//! module's `super` for the parent).

use futures_util::StreamExt;
use poolgate_wire::openai::MessagesStream;

use super::*;

type Item = Result<Bytes, std::io::Error>;

fn channel() -> (tokio::sync::mpsc::Sender<Item>, impl Stream<Item = Item> + Unpin) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Item>(4);
    (tx, futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

fn ok(s: &'static str) -> Item {
    Ok(Bytes::from_static(s.as_bytes()))
}

/// On tokio's paused clock: pings only in the silences, none while items flow.
#[tokio::test(start_paused = true)]
async fn a_silent_stream_gets_a_ping_per_interval_and_a_busy_one_none() {
    let (tx, inner) = channel();
    let mut s = KeepAlive::new(inner, Duration::from_secs(10), b"PING");
    let start = tokio::time::Instant::now();
    tx.send(ok("a")).await.unwrap();
    assert_eq!(s.next().await.unwrap().unwrap(), "a");
    // 25 s of silence: two pings, at 10 s and 20 s.
    let producer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(25)).await;
        tx.send(ok("b")).await.unwrap();
    });
    assert_eq!(s.next().await.unwrap().unwrap(), "PING");
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!(s.next().await.unwrap().unwrap(), "PING");
    assert_eq!(s.next().await.unwrap().unwrap(), "b");
    assert_eq!(start.elapsed(), Duration::from_secs(25));
    producer.await.unwrap();
    assert!(s.next().await.is_none(), "the end passes through");
}

/// Items every 4 s keep a 10 s keep-alive silent; the first ping comes a
/// whole interval after the last item, not after the timer's first arming.
#[tokio::test(start_paused = true)]
async fn a_ping_counts_the_silence_from_the_last_item() {
    let (tx, inner) = channel();
    let mut s = KeepAlive::new(inner, Duration::from_secs(10), b"PING");
    let start = tokio::time::Instant::now();
    let producer = tokio::spawn(async move {
        for _ in 0..7 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            tx.send(ok("x")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    });
    for _ in 0..7 {
        assert_eq!(s.next().await.unwrap().unwrap(), "x");
    }
    assert_eq!(start.elapsed(), Duration::from_secs(28));
    assert_eq!(s.next().await.unwrap().unwrap(), "PING");
    assert_eq!(start.elapsed(), Duration::from_secs(38));
    producer.abort();
}

/// Cut anywhere, a translated stream has the same bytes as the
/// translation fed whole; an error passes through at once.
#[tokio::test]
async fn a_translated_stream_is_the_same_however_it_is_cut_and_errors_pass_through() {
    let backend = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let mut whole = Vec::new();
    let mut t = MessagesStream::new("m");
    t.feed_into(backend.as_bytes(), &mut whole);
    t.finish_into(&mut whole);
    for every in [1, 7, 50, backend.len()] {
        let chunks: Vec<Item> = backend.as_bytes().chunks(every).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let s = Translate::new(futures_util::stream::iter(chunks), MessagesStream::new("m"));
        let out: Vec<Bytes> = s.map(|c| c.unwrap()).collect().await;
        assert!(out.iter().all(|c| !c.is_empty()), "no empty chunks");
        assert_eq!(out.concat(), whole, "cut every {every}");
    }
    let broken: Vec<Item> = vec![ok("data: {\"id\":\"c\",\"choices\":[]}\n\n"), Err(std::io::Error::other("cut"))];
    let mut s = Translate::new(futures_util::stream::iter(broken), MessagesStream::new("m"));
    assert!(s.next().await.unwrap().is_ok());
    assert!(s.next().await.unwrap().is_err(), "the error reaches the relay");
}
