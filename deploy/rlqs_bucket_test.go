package deploy

import (
	"testing"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestQuotaBucketRules: each bucket id the quota filter of envoy.yaml builds
// resolves, as the service resolves it (config.BucketEntries, then
// config.Match), to the rule its action is named after; every such rule is
// reached. A bucket whose keys the tree does not nest resolves to nothing
// (the service answers ALLOW_ALL and counts it in ratelimit_rlqs_unmatched_total).
func TestQuotaBucketRules(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	_, f := e.quotaFilter(t)
	domain := f.GetDomain()
	user := func(u string) map[string]string { return map[string]string{"x-user-id": u} }

	reached := map[string]bool{}
	for _, tt := range []struct {
		req     request
		entries []config.BucketEntry // the descriptor the bucket id stands for
	}{
		{request{"GET", "/quota/items", user("alice"), "198.51.100.70"},
			[]config.BucketEntry{{Key: "name", Value: "quota"}, {Key: "user", Value: "alice"}}},
		{request{"POST", "/QUOTA", user("bob"), "198.51.100.70"},
			[]config.BucketEntry{{Key: "name", Value: "quota"}, {Key: "user", Value: "bob"}}},
		{request{"GET", "/quota/items", nil, "198.51.100.71"},
			[]config.BucketEntry{{Key: "name", Value: "quota"}}},
		{request{"GET", "/quota/items", user(""), "198.51.100.72"},
			[]config.BucketEntry{{Key: "name", Value: "quota"}}},
	} {
		em := e.emulate(t, tt.req)
		if !em.quota {
			t.Fatalf("%v: the quota filter does not run (route %q)", tt.req, em.route)
		}
		got := evalQuota(t, f.GetBucketMatchers(), em.req)
		if got.bucket == nil {
			t.Fatalf("%v: no bucket", tt.req)
		}
		entries, ok := config.BucketEntries(cfg, domain, got.bucket)
		if !ok || len(entries) != len(tt.entries) {
			t.Fatalf("%v: bucket %v gives entries %v (ok %v), want %v", tt.req, got.bucket, entries, ok, tt.entries)
		}
		for i := range entries {
			if entries[i] != tt.entries[i] {
				t.Fatalf("%v: bucket %v gives entries %v, want %v", tt.req, got.bucket, entries, tt.entries)
			}
		}
		rule := config.Match(cfg, domain, entries)
		if rule == nil || rule.Name != got.action {
			t.Fatalf("%v: bucket %v resolves to rule %v, want the action's %q", tt.req, got.bucket, rule, got.action)
		}
		reached[rule.Name] = true
	}
	for name := range quotaActions(t, f.GetBucketMatchers()) {
		if !reached[name] {
			t.Errorf("rule %s of a quota action is reached by no bucket above", name)
		}
	}

	// A bucket of the user key alone is ShouldRateLimit's [user=<id>]
	// descriptor: the same rule and counter (api_per_user), not the quota's.
	if entries, ok := config.BucketEntries(cfg, domain, map[string]string{"user": "alice"}); !ok {
		t.Error("bucket {user: alice}: not resolved")
	} else if r := config.Match(cfg, domain, entries); r == nil || r.Name != "api_per_user" {
		t.Errorf("bucket {user: alice} resolves to %v, want api_per_user", r)
	}
	// Keys the tree does not nest under the levels reached: no rule.
	for _, bucket := range []map[string]string{
		{"name": "quota", "tenant": "acme"},
		{"name": "other", "user": "alice"},
		{"route": "quota"},
	} {
		if entries, ok := config.BucketEntries(cfg, domain, bucket); ok && config.Match(cfg, domain, entries) != nil {
			t.Errorf("bucket %v resolves to rule %v, want none", bucket, config.Match(cfg, domain, entries))
		}
	}
	if _, ok := config.BucketEntries(cfg, "no-such-domain", map[string]string{"name": "quota"}); ok {
		t.Error("a bucket of an unknown domain resolved")
	}
}
