package service

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

const leaseConfig = `
domain: l
descriptors:
  - key: seat_user
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window_log, leases: true, lease_ttl: 30s}
  - key: tokens_user
    rate_limit: {name: llm, unit: hour, requests_per_unit: 10000, algorithm: sliding_window_log, leases: true, lease_ttl: 5m}
`

func leaseService(t *testing.T, dynamic bool) (*Service, *miniredis.Miniredis) {
	t.Helper()
	s, m, _ := miniService(t, "leases.yaml", leaseConfig, &Options{ResponseDynamicMetadata: dynamic})
	return s, m
}

func askL(t *testing.T, s *Service, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "l", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// leaseOf reads a lease id from an answer's dynamic_metadata as Envoy's
// metadata action does: the path [leases, name], a string, "" when absent.
func leaseOf(resp *rlsv3.RateLimitResponse, name string) string {
	return resp.GetDynamicMetadata().GetFields()[LeasesField].GetStructValue().GetFields()[name].GetStringValue()
}

// streamDone is the stream-done descriptor Envoy builds for a lease: the
// entries of the acquisition, then the lease id under LeaseKey; nil (no
// call) when the first answer had no id, as Envoy's metadata action without
// default_value or skip_if_absent drops its descriptor.
func streamDone(id string, cost *uint64, kv ...string) *rlcommon.RateLimitDescriptor {
	if id == "" {
		return nil
	}
	if cost == nil {
		d := costDesc(1, append(kv, LeaseKey, id)...)
		d.IsNegativeHits = true
		return d
	}
	return costDesc(*cost, append(kv, LeaseKey, id)...)
}

// TestLeaseAnswers: an admitted acquisition carries its lease id in
// dynamic_metadata (with or without --response-dynamic-metadata), a denied
// one none; the stream-done descriptor frees exactly its seat, once, and
// one with a made-up id frees nothing and is answered OK.
func TestLeaseAnswers(t *testing.T) {
	for _, dynamic := range []bool{false, true} {
		s, _ := leaseService(t, dynamic)
		a := askL(t, s, costDesc(1, "seat_user", "u"))
		b := askL(t, s, costDesc(1, "seat_user", "u"))
		idA, idB := leaseOf(a, "seat_user"), leaseOf(b, "seat_user")
		if a.OverallCode != ok || b.OverallCode != ok || idA == "" || idB == "" || idA == idB {
			t.Fatalf("two acquisitions: %v %v, want OK with two lease ids", a, b)
		}
		if dynamic && a.DynamicMetadata.Fields["domain"].GetStringValue() != "l" {
			t.Fatalf("with --response-dynamic-metadata: %v, want the reference's fields beside the leases", a.DynamicMetadata)
		}
		denied := askL(t, s, costDesc(1, "seat_user", "u"))
		if denied.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || leaseOf(denied, "seat_user") != "" {
			t.Fatalf("third acquisition: %v, want OVER_LIMIT and no lease id", denied)
		}
		if d := streamDone(leaseOf(denied, "seat_user"), nil, "seat_user", "u"); d != nil {
			t.Fatal("a denied request's stream-done descriptor exists")
		}
		for _, id := range []string{"1." + strings.Repeat("0", 32), "nonsense", ""} {
			d := desc("seat_user", "u", LeaseKey, id)
			d.IsNegativeHits = true
			if r := askL(t, s, d); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 0 {
				t.Fatalf("release with id %q: %v, want OK with nothing freed", id, r)
			}
		}
		for range 2 {
			if r := askL(t, s, streamDone(idA, nil, "seat_user", "u")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
				t.Fatalf("release of a's lease: %v, want OK with one seat free (b's stays, a second release frees nothing)", r)
			}
		}
		// A release without an id (an Envoy configured for the metadata-free
		// mode) frees nothing on a rule with leases.
		old := costDesc(1, "seat_user", "u")
		old.IsNegativeHits = true
		if r := askL(t, s, old); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 1 {
			t.Fatalf("release without an id: %v, want OK, nothing freed", r)
		}
	}
}

// TestLeaseSeatExpires: a seat whose release never comes is free at the
// rule's lease_ttl (30 s), though its window is a minute.
func TestLeaseSeatExpires(t *testing.T) {
	s, m := leaseService(t, false)
	start := time.Unix(1_700_006_400, 0)
	askL(t, s, costDesc(1, "seat_user", "u"))
	askL(t, s, costDesc(1, "seat_user", "u"))
	m.SetTime(start.Add(30*time.Second - time.Microsecond))
	if r := askL(t, s, costDesc(1, "seat_user", "u")); r.OverallCode == ok {
		t.Fatalf("before the TTL: %v, want OVER_LIMIT", r)
	}
	m.SetTime(start.Add(30 * time.Second))
	if r := askL(t, s, costDesc(1, "seat_user", "u")); r.OverallCode != ok {
		t.Fatalf("at the TTL: %v, want a seat", r)
	}
}

// TestReservationSettledByItsActualCost: a reservation of 1,000 tokens
// settled at 300 leaves the budget charged 300; the id is under the rule's
// name.
func TestReservationSettledByItsActualCost(t *testing.T) {
	s, _ := leaseService(t, false)
	r := askL(t, s, costDesc(1000, "tokens_user", "u"))
	id := leaseOf(r, "llm")
	if r.OverallCode != ok || r.Statuses[0].LimitRemaining != 9000 || !strings.HasPrefix(id, "1000.") {
		t.Fatalf("reservation: %v, want OK, 9000 left, a lease of 1000 under llm", r)
	}
	actual := uint64(300)
	if r := askL(t, s, streamDone(id, &actual, "tokens_user", "u")); r.OverallCode != ok || r.Statuses[0].LimitRemaining != 9700 {
		t.Fatalf("settled at 300: %v, want OK with 9700 left", r)
	}
	if r := askL(t, s, costDesc(0, "tokens_user", "u")); r.Statuses[0].LimitRemaining != 9700 {
		t.Fatalf("check: %v, want 9700 left", r)
	}
}

// TestLeasesAndLimitOverrides: an acquisition under a limit override is a
// plain charge on the override's counter, with no lease id (an id names the
// rule's counter); a settlement that carries an override settles its lease
// on the rule's counter all the same, and never becomes a counter of its
// own keyed by the lease id.
func TestLeasesAndLimitOverrides(t *testing.T) {
	s, m := leaseService(t, false)
	override := &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE}

	acquired := desc("seat_user", "ann")
	acquired.Limit = override
	if resp := askL(t, s, acquired); resp.OverallCode != rlsv3.RateLimitResponse_OK || leaseOf(resp, "seat_user") != "" {
		t.Fatalf("an acquisition under an override: %v, want OK without a lease id", resp)
	}

	first := askL(t, s, desc("seat_user", "bob"))
	askL(t, s, desc("seat_user", "bob"))
	id := leaseOf(first, "seat_user")
	if id == "" {
		t.Fatalf("no lease id: %v", first)
	}
	if resp := askL(t, s, desc("seat_user", "bob")); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("a third seat of two: %v, want OVER_LIMIT", resp)
	}
	done := streamDone(id, nil, "seat_user", "bob")
	done.Limit = override
	if resp := askL(t, s, done); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the settlement with an override: %v, want OK", resp)
	}
	if resp := askL(t, s, desc("seat_user", "bob")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the release: %v, want the seat free again", resp)
	}
	for _, k := range m.Keys() {
		if strings.Contains(k, LeaseKey+"=") || strings.Contains(k, id) {
			t.Errorf("a counter keyed by the lease entry: %q", k)
		}
	}
}
