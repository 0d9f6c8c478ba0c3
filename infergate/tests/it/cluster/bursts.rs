//! A burst of new long sessions spread over the replicas inside one publish interval splits as one router splits
//! it: each placement reads what the other replicas dispatched since their last publish (seed report 003's dogpile
//! must not come back across replicas).

use std::collections::HashMap;

use infergate::cluster::wire::unpack;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_new_sessions_spread_over_three_replicas_splits_as_one_router_would() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    // 25k tokens/s: each ~100k-token prompt holds its engine for seconds, well past the burst.
    let engines = engines(4, slow_prefill()).await;
    let urls = urls(&engines);
    // Publishes 1 s apart: the burst (about 150 ms) lands inside one interval, or straddles one publish.
    let pool = pool_yaml("load_aware", &urls, &sessions_yaml(1000));
    let replicas = slow_publishing_replicas(&redis, &["a", "b", "c"], &pool).await;
    let all: Vec<&TestRouter> = replicas.iter().collect();

    // Eight new sessions, round robin over the replicas, each sent once the previous one's dispatch is counted in
    // the store (placements of one router are serial too; see the README for two replicas placing at the same
    // instant): one router puts two on each engine.
    let mut sent = Vec::new();
    for i in 0..8 {
        let base = all[i % 3].url();
        sent.push(tokio::spawn(async move {
            let resp = post_json(&client(), &base, CHAT)
                .header(SESSION_HEADER, format!("burst-{i}"))
                .body(chat_body(400_000, true, 4))
                .send()
                .await
                .expect("response");
            (finish(resp).await, i)
        }));
        let start = Instant::now();
        while reserved_requests(&redis).await < i as u64 + 1 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "session {i}'s reservation reached the store"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let start = Instant::now();
    while engines.iter().map(generate_requests).sum::<usize>() < 8 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the burst reached the engines"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let split: Vec<usize> = engines.iter().map(generate_requests).collect();
    for s in sent {
        assert_eq!(s.await.unwrap().0, 200);
    }
    assert_eq!(split, vec![2; 4], "split as one router splits it");
    for r in &all {
        r.wait_idle().await;
    }
}

/// Replicas `names` of `pool` (a router config without `cluster`) publishing 1 s apart, so that what a test sends
/// lands inside one interval: started healthy, connected, each knowing the others.
async fn slow_publishing_replicas(redis: &Redis, names: &[&str], pool: &str) -> Vec<TestRouter> {
    let mut replicas = Vec::new();
    for name in names {
        let cluster =
            cluster_yaml(redis, name).replace("publish_interval: 100ms", "publish_interval: 1s");
        let r = start_router(&format!("{pool}{cluster}")).await;
        r.all_healthy().await;
        replicas.push(r);
    }
    let all: Vec<&TestRouter> = replicas.iter().collect();
    wait_state(&all, "connected", Duration::from_secs(10)).await;
    let start = Instant::now();
    let others = (names.len() - 1) as f64;
    for r in &all {
        while r.metric_sum("infergate_cluster_peers", &[]).await != others {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "each replica knows the {others} others"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    replicas
}

/// Requests the replicas' reservations hold, summed over every replica and epoch.
async fn reserved_requests(redis: &Redis) -> u64 {
    let mut c = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("infergate:reserved:*")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut n = 0;
    for k in keys {
        let fields: HashMap<String, i64> = redis::cmd("HGETALL")
            .arg(&k)
            .query_async(&mut c)
            .await
            .unwrap();
        n += fields.values().map(|&v| unpack(v).requests).sum::<u64>();
    }
    n
}

/// A prefill leg is reserved in the store when it is placed, as a decode leg's dispatch is: a replica placing the
/// next long prompt inside the same publish interval sees it and sends its own prefill to the other engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_leg_is_reserved_and_the_next_replica_prefills_elsewhere() {
    let Some(redis) = Redis::start().await else {
        return;
    };
    let nixl = SimConfig {
        kv_transfer: true,
        ..slow_prefill()
    };
    let prefill = engines(2, nixl.clone()).await;
    let decode = engines(1, nixl).await;
    let list = |e: &[infergate_sim::EngineHandle]| {
        urls(e)
            .iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let checks =
        "{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }";
    let pool = format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: pd\n    models: [\"*\"]\n    endpoints: [{}]\n    health_check: {checks}\n\
         \x20   disaggregation:\n      connector: nixl\n      prefill:\n        endpoints: [{}]\n        \
         health_check: {checks}\n",
        list(&decode),
        list(&prefill),
    );
    let replicas = slow_publishing_replicas(&redis, &["a", "b"], &pool).await;
    let all: Vec<&TestRouter> = replicas.iter().collect();
    // The prefill set's endpoint holding prompt tokens on replica `r` (the set is kept after the configured pools).
    let holding = |r: &TestRouter| -> Vec<String> {
        r.state.pools.pools[1]
            .endpoints()
            .iter()
            .filter(|e| e.load.prefill_tokens() > 0)
            .map(|e| e.label.clone())
            .collect()
    };
    let mut sent = Vec::new();
    for (i, r) in all.iter().enumerate() {
        let base = r.url();
        // ~100k tokens at 25k tokens/s: each prefill takes about 4 s, past the publish interval.
        sent.push(tokio::spawn(async move {
            finish(send_chat(&base, chat_body(400_000, true, 4)).await).await
        }));
        let start = Instant::now();
        while holding(r).is_empty() || reserved_requests(&redis).await < i as u64 + 1 {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "request {i}: its prefill leg held on {:?} and reserved in the store ({} reserved)",
                holding(r),
                reserved_requests(&redis).await
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let (a, b) = (holding(all[0]), holding(all[1]));
    assert!(
        a.len() == 1 && b.len() == 1 && a != b,
        "one prefill per engine: replica a on {a:?}, replica b on {b:?}"
    );
    for s in sent {
        assert_eq!(s.await.unwrap(), 200);
    }
    for r in &all {
        r.wait_idle().await;
    }
}
