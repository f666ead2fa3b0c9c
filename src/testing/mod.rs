//! Test utilities (feature `test-util`): a throwaway `redis-server`
//! ([`LocalRedis`](local_redis::LocalRedis)). The demo and the bench use it too.

pub mod local_redis;
