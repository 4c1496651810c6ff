// Package envoyrlqs is Envoy's Rate Limit Quota Service client
// (envoy.filters.http.rate_limit_quota) emulated as Envoy's source has it,
// quirks included, for the e2e tests and the load generator. It speaks gRPC
// (StreamRateLimitQuotas) to any RateLimitQuotaService server.
//
// One Client is one Envoy process's client for one domain: Envoy shares one
// stream per (RLQS server, domain) between its workers and filter configs
// (filter_persistence.cc getTlsStore). Emulated, from envoyproxy/envoy's
// source/extensions/filters/http/rate_limit_quota/ (global_client_impl.cc
// "GC", filter.cc "F") and source/common/common/token_bucket_impl.cc ("TB"):
//
//   - The stream opens lazily at the first bucket, with the report timer (GC
//     createBucketImpl). A new bucket's report goes at once, alone: 1 request,
//     allowed or denied as decided, time_elapsed 0 (GC buildReports(bucket)).
//   - Every ReportInterval (Envoy: 5 s, hard-coded in filter_persistence.cc
//     initTlsStore; reporting_interval is ignored) one report lists every
//     bucket, with the domain, the counts since the last report (reset as they
//     are read) and time_elapsed in whole seconds (GC getUsageFromBucket).
//   - A closed stream is forgotten; the next tick builds the report, then
//     reopens the stream; if that fails the report is dropped (GC
//     onSendReportsTimer). Buckets, assignments and their timers stay.
//   - Assignments (GC onQuotaResponseImpl): actions for unknown or empty bucket
//     ids, requests_per_time_unit and strategy-less assignments are ignored;
//     TTLs are whole seconds (under 1 s: expired at once); an equal token
//     bucket (protoTokenBucketsEq: fill_interval.nanos only) is kept, another
//     one starts full; abandon_action erases the bucket. On expiry the
//     expired_assignment_behavior fallback runs for its timeout (whole seconds,
//     0 ends it at once), then the no_assignment_behavior default (GC
//     onActionExpirationTimer, onFallbackExpirationTimer).
//   - Decisions (F recordBucketUsage, shouldAllowRequest): before an
//     assignment, the default decides without waiting; only a blanket DENY_ALL
//     denies a new bucket's first request. Strategies Envoy does not enforce
//     (requests_per_time_unit, none) let everything through.
//   - The token bucket is Envoy's AtomicTokenBucketImpl (TB): continuous refill
//     at tokens_per_fill / whole seconds of fill_interval, capped at max_tokens,
//     starting full, one token a request; its floating-point edges (a
//     fill_interval under 1 s admits everything, tokens_per_fill unset is a
//     rate of one token a year) come out of the same arithmetic.
//
// Not emulated: the matcher tree and bucket_id_builder (the caller gives the
// bucket id of each request; a request matching nothing is simply not given),
// deny responses (Allow says allowed or denied, not what the client receives),
// reuse_last_assignment (Envoy does not implement it either), a token bucket as
// no_assignment_behavior (Envoy dereferences a null limiter on the second
// request: New refuses it), and the variant of c33e7f82 where a replacing
// token bucket passes a remaining-tokens ratio into the constructor's bool
// init_fill (here a replacement always starts full, as in 0b559611), and the
// token_bucket_impl.cc variant whose init_fill, when max_tokens / rate exceeds
// the monotonic clock's reading (about the host's uptime), logs an ENVOY_BUG
// and starts the bucket empty (always so for tokens_per_fill unset).
//
// Timers (report period, TTLs, fallback timeout) run on real time; the token
// buckets and time_elapsed read Options.Now, as Envoy's monotonic time source.
package envoyrlqs
