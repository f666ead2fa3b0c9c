// Compiled (never run) by `npm run typecheck`: the README's calls type-check against the
// published declarations (dist/index.d.ts).
import {
  Client,
  Consumer,
  ConsumerApiError,
  LeaseLostError,
  type PullDelivery,
  DelayqError,
  InvalidInputError,
  NotReplicatedError,
  PartialBatchError,
  QueueNotFoundError,
  jsonText,
  type NewOrder,
  type Priority,
  type Scheduled,
  type ScheduledOrder,
} from "delayq";

export async function usage(): Promise<void> {
  const dq = await Client.connect("redis://127.0.0.1:6379", { namespace: "dq", maxPayloadBytes: 65536 });
  const s: Scheduled = await dq.schedule("order-close", { id: "order-1234", delayMs: 15 * 60_000, payload: { user: 42 } });
  const orders: NewOrder[] = [
    { id: "a", at: new Date(s.dueAtMs), payloadJson: '{"n":123456789012345678901234567890}' },
    { id: "b", at: "2030-01-01T00:00:00Z", payload: { amount: 10n, raw: jsonText("1.50") } },
    { id: "c", delayMs: 1000 },
    { id: "d", delayMs: 1000, priority: "high" },
    { id: "e", debounce: { delayMs: 500, maxWaitMs: 2000 }, repeat: true },
  ];
  const many: Scheduled[] = await dq.scheduleMany("order-close", orders, { mode: "if_absent" });
  const outcome: "created" | "updated" | "unchanged" | "duplicate" | "cancelled_by_event" = many[0]!.outcome;
  const dispatchedAt: number | undefined = many[0]!.dispatchedAtMs;
  const cancelledBy: string | undefined = many[0]!.event;
  const cancelled: "cancelled" | "not_found" = await dq.cancel("order-close", "order-1234");
  const moved: "rescheduled" | "not_found" = await dq.reschedule("order-close", "a", { delayMs: 5 });
  const level: Priority = "low";
  await dq.reschedule("order-close", "a", { delayMs: 5 }, { priority: level });
  const got: ScheduledOrder | null = await dq.get("order-close", "a");
  const text: string | undefined = got?.payloadJson;
  const priority: Priority | undefined = got?.priority;
  const durable = dq.withDurability({ replicas: 1, timeoutMs: 1000 });
  try {
    await durable.scheduleMany("order-close", orders);
  } catch (e) {
    if (e instanceof InvalidInputError) console.log(e.code, e.index);
    else if (e instanceof QueueNotFoundError) console.log(e.queue);
    else if (e instanceof NotReplicatedError) console.log(e.acked, e.wanted);
    else if (e instanceof PartialBatchError) console.log(e.results.map((r) => r.outcome));
    else if (e instanceof DelayqError && e.writeOutcome === "unknown") console.log(e.code);
  }
  console.log(outcome, dispatchedAt, cancelledBy, cancelled, moved, text, priority);
  await dq.close();
}

export async function consume(): Promise<void> {
  const c = new Consumer({ baseUrl: "http://127.0.0.1:8080", token: "t0ken-123", queue: "order-close", group: "close", leaseMs: 30_000, timeoutMs: 5000 });
  const got: PullDelivery[] = await c.receive(10);
  const first = got[0];
  if (first) {
    const text: string = first.payloadJson;
    const [ext] = await c.extend(first, 60_000);
    if (ext?.status === "extended") console.log(ext.receipt, text);
    try {
      const statuses: ("acked" | "lease_lost")[] = await c.ack([first]);
      console.log(statuses);
    } catch (e) {
      if (e instanceof LeaseLostError) console.log(e.code);
      else if (e instanceof ConsumerApiError) console.log(e.status, e.code);
    }
    await c.nack(first.receipt, { retryInMs: 1000, error: "shop down" });
  }
  const stop = new AbortController();
  await c.run(async (d: PullDelivery) => console.log(d.id, d.attempt), { concurrency: 4, signal: stop.signal, onError: (e, d) => console.log(e, d?.id) });
}
