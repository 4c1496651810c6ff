package e2e

// Bad input: requests at and one past every documented bound, messages past
// gRPC's size limit, and costs up to the largest hits_addend. An accepted
// request is decided (and charged); a refused one is INVALID_ARGUMENT naming
// the bound, and charges nothing; nothing is ever INTERNAL.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// boundsConfig has, in domain "bounds": a rule on key k (one counter per
// value); a rule on a key exactly maxBytes long; a chain e0 > e1 > ... of
// maxEntries levels with a rule at every level, so that a descriptor of n
// entries e0..e(n-1) is limited; and rules at the largest limits for the
// hits_addend checks.
func boundsConfig(maxEntries, maxBytes int) string {
	var b strings.Builder
	const limit = "rate_limit: {unit: hour, requests_per_unit: 100}"
	fmt.Fprintf(&b, "domain: bounds\ndescriptors:\n  - key: k\n    %s\n", limit)
	fmt.Fprintf(&b, "  - key: %s\n    %s\n", strings.Repeat("K", maxBytes), limit)
	indent := "  "
	for i := range maxEntries {
		fmt.Fprintf(&b, "%s- key: e%d\n%s  %s\n", indent, i, indent, limit)
		if i < maxEntries-1 {
			fmt.Fprintf(&b, "%s  descriptors:\n", indent)
		}
		indent += "    "
	}
	b.WriteString(`  - key: max_counter
    rate_limit: {unit: hour, requests_per_unit: 4294967295, algorithm: sliding_window_counter}
  - key: max_fixed
    rate_limit: {unit: hour, requests_per_unit: 4294967295, algorithm: fixed_window}
  - key: max_log
    rate_limit: {unit: hour, requests_per_unit: 10000, algorithm: sliding_window_log}
`)
	return b.String()
}

// chain is a descriptor of n entries e0..e(n-1), each value value.
func chain(n int, value string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := range n {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: "e" + strconv.Itoa(i), Value: value})
	}
	return d
}

func dbSize(t *testing.T, r *redisServer) int64 {
	t.Helper()
	n, err := r.client.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// askCode sends req and returns its answer or its error's code and message.
func askCode(t *testing.T, s *server, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, codes.Code, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.rls.ShouldRateLimit(ctx, req)
	st := status.Convert(err)
	if st.Code() == codes.Internal || st.Code() == codes.Unknown {
		t.Fatalf("%v: %s", st.Code(), st.Message())
	}
	return resp, st.Code(), st.Message()
}

// TestBoundsAtAndPast: each bound of --max-descriptors and --max-entries, at
// the defaults and at small flags: exactly at the bound is accepted and
// decided, one past is refused with a message naming it, counted by reason,
// and charges nothing. Long domains, keys and values are no bound: they are
// decided (hostile_test.go has values of any length and bytes).
func TestBoundsAtAndPast(t *testing.T) {
	t.Parallel()
	for _, bc := range []struct {
		name                           string
		maxDescriptors, maxEntries, mb int
		flags                          []string
	}{
		{"defaults", 64, 32, 4096, nil},
		{"flags", 3, 2, 16, []string{"--max-descriptors", "3", "--max-entries", "2"}},
	} {
		t.Run(bc.name, func(t *testing.T) {
			r := startRedis(t)
			s := startServer(t, r, boundsConfig(bc.maxEntries, bc.mb), bc.flags...)
			many := func(n int) *rlsv3.RateLimitRequest {
				req := request("bounds")
				for i := range n {
					req.Descriptors = append(req.Descriptors, descriptor("k", "many-"+strconv.Itoa(i)))
				}
				return req
			}
			long := strings.Repeat("v", bc.mb)
			longKey := strings.Repeat("K", bc.mb)

			// At the bound: accepted, and every limited descriptor decided.
			at := []struct {
				name    string
				req     *rlsv3.RateLimitRequest
				limited int // descriptors a rule limits: each charges one key
			}{
				{"descriptors", many(bc.maxDescriptors), bc.maxDescriptors},
				{"entries", request("bounds", chain(bc.maxEntries, "x")), 1},
				{"value bytes", request("bounds", descriptor("k", long)), 1},
				{"key bytes", request("bounds", descriptor(longKey, "x")), 1},
				{"domain bytes", request(strings.Repeat("d", bc.mb), descriptor("k", "x")), 0}, // unknown domain: not limited
			}
			for _, tc := range at {
				keys := dbSize(t, r)
				resp, code, msg := askCode(t, s, tc.req)
				if code != codes.OK {
					t.Fatalf("%s at the bound: %v %s", tc.name, code, msg)
				}
				if resp.OverallCode != ok || len(resp.Statuses) != len(tc.req.Descriptors) {
					t.Fatalf("%s at the bound: %v", tc.name, resp)
				}
				limited := 0
				for _, st := range resp.Statuses {
					if st.CurrentLimit != nil {
						limited++
						if st.LimitRemaining != 99 {
							t.Fatalf("%s at the bound: %v, want 99 left", tc.name, st)
						}
					}
				}
				if limited != tc.limited {
					t.Fatalf("%s at the bound: %d limited descriptors, want %d", tc.name, limited, tc.limited)
				}
				if got := dbSize(t, r) - keys; got != int64(tc.limited) {
					t.Fatalf("%s at the bound: %d keys written, want %d", tc.name, got, tc.limited)
				}
			}

			// One past: refused, named, counted; nothing written. Each
			// request also carries descriptors that match a rule, so that
			// a check made descriptor by descriptor would have charged.
			pastEntries := chain(bc.maxEntries+1, "x")
			past := []struct {
				name, reason, msg string
				req               *rlsv3.RateLimitRequest
			}{
				{"descriptors", "too_many_descriptors",
					fmt.Sprintf("request has more than the limit of %d descriptors", bc.maxDescriptors),
					many(bc.maxDescriptors + 1)},
				{"entries", "too_many_entries",
					fmt.Sprintf("descriptor 1 has more than the limit of %d entries", bc.maxEntries),
					request("bounds", descriptor("k", "past"), pastEntries)},
			}
			keys := dbSize(t, r)
			for _, tc := range past {
				_, code, msg := askCode(t, s, tc.req)
				if code != codes.InvalidArgument || msg != tc.msg {
					t.Errorf("%s one past the bound: %v %q, want InvalidArgument %q", tc.name, code, msg, tc.msg)
				}
				if got := metric(t, s, `ratelimit_invalid_requests_total{reason="`+tc.reason+`"}`); got != "1" {
					t.Errorf("%s one past the bound: %s counted %q times, want 1", tc.name, tc.reason, got)
				}
			}
			if got := dbSize(t, r); got != keys {
				t.Fatalf("refused requests wrote %d keys", got-keys)
			}
			// The service still decides: the counter at 99 goes on.
			if st := s.ask(t, request("bounds", descriptor("k", long))).Statuses[0]; st.Code != ok || st.LimitRemaining != 98 {
				t.Fatalf("after the refusals: %v, want 98 left", st)
			}
		})
	}
}

// TestAddendExtremes: hits_addend up to the largest value of its type, on
// the request (uint32) and on the descriptor (uint64). A cost above the
// limit is OVER_LIMIT at once with the window as the wait, and writes
// nothing, not even for the other descriptors of the request; a cost equal
// to the largest limit is admitted once, exactly. With --record-costs never,
// a descriptor's cost is not a report of a cost already spent (those are
// recorded past the limit: e2e/budget_test.go).
func TestAddendExtremes(t *testing.T) {
	t.Parallel()
	r := startRedis(t)
	s := startServer(t, r, boundsConfig(1, 64), "--record-costs", "never")
	ctx := context.Background()

	withCost := func(d *rlcommon.RateLimitDescriptor, cost uint64) *rlcommon.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(cost)
		return d
	}
	type want struct {
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}
	check := func(name string, req *rlsv3.RateLimitRequest, keysWritten int64, wants ...want) *rlsv3.RateLimitResponse {
		t.Helper()
		keys := dbSize(t, r)
		resp, code, msg := askCode(t, s, req)
		if code != codes.OK {
			t.Fatalf("%s: %v %s", name, code, msg)
		}
		for i, w := range wants {
			if st := resp.Statuses[i]; st.Code != w.code || st.LimitRemaining != w.remaining {
				t.Fatalf("%s: status %d %v, want %v with %d left", name, i, st, w.code, w.remaining)
			}
		}
		if got := dbSize(t, r) - keys; got != keysWritten {
			t.Fatalf("%s: %d keys written, want %d", name, got, keysWritten)
		}
		return resp
	}
	overAtOnce := func(name string, resp *rlsv3.RateLimitResponse, i int) {
		t.Helper()
		if d := resp.Statuses[i].DurationUntilReset.AsDuration(); d != time.Hour {
			t.Fatalf("%s: wait %v, want the window (1h)", name, d)
		}
		if retry, _ := headerValue(resp, "retry-after"); retry != "3600" {
			t.Fatalf("%s: retry-after %q, want 3600", name, retry)
		}
	}

	// Request-level: uint32's maximum against a limit of 100.
	req := request("bounds", descriptor("k", "req-max"))
	req.HitsAddend = math.MaxUint32
	overAtOnce("request hits_addend 4294967295", check("request hits_addend 4294967295", req, 0, want{over, 0}), 0)

	// Descriptor-level: uint64's maximum, alone, twice on one counter (the
	// costs add up, saturating), and beside an admissible descriptor, which
	// all or nothing leaves uncharged.
	overAtOnce("descriptor hits_addend 2^64-1", check("descriptor hits_addend 2^64-1",
		request("bounds", withCost(descriptor("k", "desc-max"), math.MaxUint64)), 0, want{over, 0}), 0)
	check("two descriptors of 2^64-1 on one counter",
		request("bounds", withCost(descriptor("k", "twice"), math.MaxUint64), withCost(descriptor("k", "twice"), math.MaxUint64)),
		0, want{over, 0}, want{over, 0})
	overAtOnce("2^64-1 beside a cost of 1", check("2^64-1 beside a cost of 1",
		request("bounds", descriptor("k", "beside"), withCost(descriptor("k", "desc-max"), math.MaxUint64)),
		0, want{ok, 100}, want{over, 0}), 1)
	// The request-level cost is overridden by a descriptor's own.
	req = request("bounds", withCost(descriptor("k", "override"), 1))
	req.HitsAddend = math.MaxUint32
	check("descriptor cost 1 under request cost 4294967295", req, 1, want{ok, 99})

	// At the largest limit: a cost of exactly 4294967295 fits once.
	for _, key := range []string{"max_counter", "max_fixed"} {
		req := request("bounds", descriptor(key, "all"))
		req.HitsAddend = math.MaxUint32
		check(key+" cost 4294967295", req, 1, want{ok, 0})
		check(key+" one more", request("bounds", descriptor(key, "all")), 0, want{over, 0})
		keys, err := r.client.Keys(ctx, "rl:{bounds|"+key+"=all}:*").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("%s keys %v %v", key, keys, err)
		}
		if n := windowCount(t, r.client, keys[0]); n != math.MaxUint32 {
			t.Fatalf("%s stored %d, want 4294967295", key, n)
		}
		// One past the largest limit: never admissible, answered at once.
		overAtOnce(key+" cost 2^32", check(key+" cost 2^32",
			request("bounds", withCost(descriptor(key, "past"), math.MaxUint32+1)), 0, want{over, 0}), 0)
	}
	// The log at its largest limit: 10000 members in one script.
	req = request("bounds", descriptor("max_log", "all"))
	req.HitsAddend = 10000
	check("max_log cost 10000", req, 1, want{ok, 0})
	check("max_log one more", request("bounds", descriptor("max_log", "all")), 0, want{over, 0})
	if n := r.client.ZCard(ctx, "rl:{bounds|max_log=all}:log:3600").Val(); n != 10000 {
		t.Fatalf("max_log stored %d members, want 10000", n)
	}
	req = request("bounds", descriptor("max_log", "past"))
	req.HitsAddend = 10001
	check("max_log cost 10001", req, 0, want{over, 0})

	if got := metric(t, s, `ratelimit_store_errors_total{kind="redis"}`); got != "" {
		t.Fatalf("Redis errors: %s", got)
	}
	waitFor(t, 2*time.Second, func() error {
		if !strings.Contains(s.logs.String(), "cost exceeds the limit") {
			return errNotYet
		}
		return nil
	})
}
