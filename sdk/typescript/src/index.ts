// delayq: the producer side of the order-expiry delay queue on Redis, for Node.js.

export {
  Client,
  MAX_BATCH,
  ENQUEUE_CALL_BYTES,
  ENQUEUE_CALL_ORDERS,
  MAX_WAIT_MS,
  type CancelOutcome,
  type ClientOptions,
  type EventPosted,
  type Durability,
  type Mode,
  type RescheduleOutcome,
  type ScheduleOutcome,
  type Scheduled,
  type ScheduledOrder,
} from "./client.js";
export {
  DelayqError,
  InvalidInputError,
  NotReplicatedError,
  PartialBatchError,
  QueueNotFoundError,
  RedisError,
  ReplyError,
  type InvalidInputCode,
  type ItemOutcome,
  type WriteOutcome,
} from "./errors.js";
export { MAX_ID_LEN, MAX_NAME_LEN, MAX_SHARDS, fnv1a64, queueRecordKey, shardKeys, shardOf, type ShardKeys } from "./keys.js";
export {
  DEFAULT_MAX_PAYLOAD_BYTES,
  JsonText,
  MAX_AHEAD_MS,
  MAX_PAYLOAD_DEPTH,
  MAX_TAGS,
  MAX_TAG_LEN,
  PRIORITIES,
  checkExpiresAfter,
  checkTags,
  checkEvent,
  eventToken,
  checkDebounce,
  checkPriority,
  jsonText,
  type Debounce,
  type NewOrder,
  type Priority,
  type When,
} from "./message.js";
export { LUA_DIR, SCRIPTS, SCRIPT_NAMES, type Script, type ScriptName } from "./scripts.js";
export {
  Consumer,
  ConsumerApiError,
  LeaseLostError,
  type AckStatus,
  type ConsumerOptions,
  type ExtendResult,
  type Handler,
  type NackOptions,
  type PullDelivery,
  type RunOptions,
} from "./consumer.js";
