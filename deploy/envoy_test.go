package deploy

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/decision"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/service"
)

// ---------------------------------------------------------------------------
// The service, in process, on a miniredis with a frozen clock.

// epoch is aligned to every window of config/, so a test knows where fixed
// windows start.
var epoch = time.Unix(1_700_006_400, 0)

type rig struct {
	edge *edge
	cfg  *config.Config
	svc  *service.Service
	m    *miniredis.Miniredis
	now  time.Time
}

func newRig(t *testing.T, e *edge, cfg *config.Config) *rig {
	t.Helper()
	m := miniredis.RunT(t)
	// No retries: a stopped miniredis fails at once rather than after backoff.
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	x := &rig{edge: e, cfg: cfg, m: m}
	x.set(epoch.Add(100 * time.Millisecond))
	// A generous store deadline: the race detector slows the Lua scripts.
	l := limiter.New(client, &limiter.Options{Timeout: 5 * time.Second, DenyCache: -1}) // the test moves Redis's clock
	t.Cleanup(l.Close)
	x.svc = service.New(cfg, decision.Direct(l), nil)
	return x
}

func (x *rig) set(now time.Time) {
	x.now = now
	x.m.SetTime(now)
}

// outcome is one request's trip through Envoy and the service.
type outcome struct {
	emulated
	resp  *rlsv3.RateLimitResponse // nil when the service was not asked
	reply reply
}

// send emulates Envoy on r, asks the service when Envoy would (at least one
// descriptor), and moves the clock a millisecond on. Every descriptor must
// match a rule of config/.
func (x *rig) send(t *testing.T, r request) outcome {
	t.Helper()
	defer x.set(x.now.Add(time.Millisecond))
	out := outcome{emulated: x.edge.emulate(t, r)}
	if out.rejected != 0 {
		out.reply = reply{status: out.rejected}
		return out
	}
	if len(out.descriptors) == 0 { // the filter does not call the service
		out.reply = reply{upstream: true}
		return out
	}
	for _, d := range out.descriptors {
		if config.Match(x.cfg, x.edge.filter.GetDomain(), d.GetEntries()) == nil {
			t.Errorf("%v: descriptor %s matches no rule of %s", r, descString(d), rulesDir)
		}
	}
	resp, err := x.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain:      x.edge.filter.GetDomain(),
		Descriptors: out.descriptors,
	})
	// UNAVAILABLE is the service's answer when the store cannot decide a
	// rule without failure_mode: Envoy's failure_mode_deny then decides.
	if err != nil && status.Code(err) != codes.Unavailable {
		t.Fatalf("%v: ShouldRateLimit: %v", r, err)
	}
	out.resp, out.reply = resp, x.edge.reply(r, resp, err)
	return out
}

// finish ends a request that send let through: the app answers with
// response headers, and when the stream is done Envoy sends the route's
// apply_on_stream_done descriptors, ignoring the answer. It returns them.
func (x *rig) finish(t *testing.T, out outcome, response map[string]string) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	defer x.set(x.now.Add(time.Millisecond))
	if !out.reply.upstream {
		response = nil // a local reply: the app never answered
	}
	ds := x.edge.streamDone(t, out.emulated, response, out.resp.GetDynamicMetadata())
	if len(ds) > 0 {
		x.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{ //nolint:errcheck // Envoy ignores it
			Domain:      x.edge.filter.GetDomain(),
			Descriptors: ds,
		})
	}
	return ds
}

func ruleNamed(t *testing.T, cfg *config.Config, name string) *config.Rule {
	t.Helper()
	for _, r := range cfg.Rules() {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no rule named %q in %s", name, rulesDir)
	return nil
}

// ---------------------------------------------------------------------------
// Tests.

// TestEnvoyDescriptors runs requests through the emulated listener and checks
// the exact descriptors Envoy would send, then that together they reach every
// rule of config/ and that each one matches a rule.
func TestEnvoyDescriptors(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	user := func(u string) map[string]string { return map[string]string{"x-user-id": u} }
	hit := map[string]bool{} // the rules reached, by Rule.String

	for _, tt := range []struct {
		name     string
		req      request
		rejected int
		route    string
		want     []string
	}{
		{"probe is never limited", request{"GET", "/healthz", nil, "10.0.0.1"}, 0, "healthz", nil},
		{"login with user", request{"POST", "/login", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login with query", request{"POST", "/login?next=/home", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login subpath", request{"POST", "/login/", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login upper case", request{"POST", "/LOGIN", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login double slash", request{"POST", "//login", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login dot segments", request{"POST", "/api/../login", user("alice"), "203.0.113.10"}, 0, "login",
			[]string{"path=/login|user=alice", "remote_address=203.0.113.10"}},
		{"login escaped slash", request{"POST", "/api%2F..%2Flogin", user("alice"), "203.0.113.10"}, 400, "", nil},
		{"underscore header", request{"POST", "/login", map[string]string{"x_user_id": "alice"}, "203.0.113.10"}, 400, "", nil},
		{"not login", request{"POST", "/loginx", user("alice"), "203.0.113.10"}, 0, "default",
			[]string{"remote_address=203.0.113.10"}},
		{"login without user", request{"POST", "/login", nil, "203.0.113.11"}, 0, "login",
			[]string{"remote_address=203.0.113.11"}},
		{"login empty headers", request{"POST", "/login", map[string]string{"x-user": "alice"}, "203.0.113.11"}, 0, "login",
			[]string{"remote_address=203.0.113.11"}},
		{"api read", request{"GET", "/api/items", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "remote_address=198.51.100.1"}},
		{"api root", request{"GET", "/api", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "remote_address=198.51.100.1"}},
		{"api head", request{"HEAD", "/api/items", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "remote_address=198.51.100.1"}},
		{"api options", request{"OPTIONS", "/api/items", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "remote_address=198.51.100.1"}},
		{"api write", request{"POST", "/api/items", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "method=write|user=carol", "remote_address=198.51.100.1"}},
		{"api delete, mixed case path", request{"DELETE", "/API/items/7", user("carol"), "198.51.100.1"}, 0, "api",
			[]string{"user=carol", "method=write|user=carol", "remote_address=198.51.100.1"}},
		{"api write without user", request{"PUT", "/api/items/7", nil, "198.51.100.2"}, 0, "api",
			[]string{"remote_address=198.51.100.2"}},
		{"llm", request{"POST", "/llm/v1/chat", user("dana"), "198.51.100.40"}, 0, "llm",
			[]string{"tokens_user=dana", "remote_address=198.51.100.40"}},
		{"llm without user", request{"POST", "/LLM", nil, "198.51.100.41"}, 0, "llm",
			[]string{"remote_address=198.51.100.41"}},
		{"concurrency", request{"GET", "/concurrency/export", user("erin"), "198.51.100.42"}, 0, "concurrency",
			[]string{"concurrent_user=erin", "remote_address=198.51.100.42"}},
		{"not api", request{"GET", "/apix", user("carol"), "198.51.100.1"}, 0, "default",
			[]string{"remote_address=198.51.100.1"}},
		{"spoofed x-forwarded-for is ignored", request{"GET", "/", map[string]string{"x-forwarded-for": "192.0.2.99"}, "198.51.100.20"}, 0, "default",
			[]string{"remote_address=198.51.100.20"}},
		{"ipv6 client", request{"GET", "/index.html", nil, "2001:db8::1"}, 0, "default",
			[]string{"remote_address=2001:db8::1"}},
		{"grpc call", request{"POST", "/shop.v1.Cart/AddItem", map[string]string{"content-type": "application/grpc"}, "198.51.100.30"}, 0, "default",
			[]string{"remote_address=198.51.100.30"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := e.emulate(t, tt.req)
			if got.rejected != tt.rejected || got.route != tt.route {
				t.Errorf("rejected %d, route %q; want %d, %q", got.rejected, got.route, tt.rejected, tt.route)
			}
			if ds := descStrings(got.descriptors); !slices.Equal(ds, tt.want) {
				t.Errorf("descriptors:\n  %q\nwant:\n  %q", ds, tt.want)
			}
			for _, d := range got.descriptors {
				r := config.Match(cfg, e.filter.GetDomain(), d.GetEntries())
				if r == nil {
					t.Errorf("descriptor %s matches no rule of %s", descString(d), rulesDir)
					continue
				}
				hit[r.String()] = true
			}
		})
	}

	// Every rule of config/ is reached by some request above: a rule whose
	// nesting or keys drifted from the actions fails here. The rules of the
	// quota filter's buckets are reached by bucket ids instead
	// (rlqs_bucket_test.go).
	_, quota := e.quotaFilter(t)
	buckets := quotaActions(t, quota.GetBucketMatchers())
	for _, r := range cfg.Rules() {
		if !hit[r.String()] && buckets[r.Name] == nil {
			t.Errorf("rule %s (%s, %s) is matched by no descriptor Envoy produces", r, r.Name, r.Source)
		}
	}
	// And the emulator itself notices a drift: nesting user before path in
	// the login action yields a descriptor that matches nothing.
	login := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "login" })
	if login < 0 {
		t.Fatal("no route named login")
	}
	acts := proto.Clone(e.vhost.GetRoutes()[login].GetRoute().GetRateLimits()[0]).(*routev3.RateLimit).GetActions()
	slices.Reverse(acts)
	d := descriptor(t, acts, request{"POST", "/login", user("alice"), "203.0.113.10"})
	if d == nil || config.Match(cfg, e.filter.GetDomain(), d.GetEntries()) != nil {
		t.Errorf("reversed login actions produced %s, which should match no rule", descString(d))
	}
}

// TestEnvoyLimits sends each kind of traffic until its limit trips, and
// checks what the client gets from Envoy: 429 (or RESOURCE_EXHAUSTED for
// gRPC) with retry-after, other identities unaffected, and a retry after the
// announced wait admitted. The number of requests comes from config/.
func TestEnvoyLimits(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	ip := func(i int) string { return fmt.Sprintf("10.1.%d.%d", i/200, i%200+1) } // a different address each time

	for _, tt := range []struct {
		name  string
		rule  string              // the rule that trips
		req   func(i int) request // the i-th request
		want  []string            // its descriptors, for i = 0
		other request             // another identity, still admitted after the trip
		grpc  bool
	}{
		{
			name: "login per user",
			rule: "login_per_user",
			req: func(int) request {
				return request{"POST", "/login", map[string]string{"x-user-id": "alice"}, "203.0.113.10"}
			},
			want:  []string{"path=/login|user=alice", "remote_address=203.0.113.10"},
			other: request{"POST", "/login", map[string]string{"x-user-id": "bob"}, "203.0.113.10"},
		},
		{
			name: "api per user, from changing addresses",
			rule: "api_per_user",
			req: func(i int) request {
				return request{"GET", "/api/items", map[string]string{"x-user-id": "carol"}, ip(i)}
			},
			want:  []string{"user=carol", "remote_address=10.1.0.1"},
			other: request{"GET", "/api/items", map[string]string{"x-user-id": "dave"}, "10.2.0.1"},
		},
		{
			name: "api writes per user",
			rule: "api_writes_per_user",
			req: func(i int) request {
				return request{"POST", "/api/items", map[string]string{"x-user-id": "erin"}, ip(i)}
			},
			want:  []string{"user=erin", "method=write|user=erin", "remote_address=10.1.0.1"},
			other: request{"GET", "/api/items", map[string]string{"x-user-id": "erin"}, "10.2.0.2"}, // reads still pass
		},
		{
			name:  "per address",
			rule:  "per_address",
			req:   func(int) request { return request{"GET", "/", nil, "198.51.100.7"} },
			want:  []string{"remote_address=198.51.100.7"},
			other: request{"GET", "/", nil, "198.51.100.8"},
		},
		{
			name:  "login without user is limited per address",
			rule:  "per_address",
			req:   func(int) request { return request{"POST", "/login", nil, "198.51.100.9"} },
			want:  []string{"remote_address=198.51.100.9"},
			other: request{"POST", "/login", nil, "198.51.100.10"},
		},
		{
			name: "grpc per address",
			rule: "per_address",
			req: func(int) request {
				return request{"POST", "/shop.v1.Cart/AddItem", map[string]string{"content-type": "application/grpc"}, "198.51.100.11"}
			},
			want:  []string{"remote_address=198.51.100.11"},
			other: request{"POST", "/shop.v1.Cart/AddItem", map[string]string{"content-type": "application/grpc"}, "198.51.100.12"},
			grpc:  true,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			x := newRig(t, e, cfg)
			rule := ruleNamed(t, cfg, tt.rule)
			n := int(rule.RequestsPerUnit)

			first := x.send(t, tt.req(0))
			if got := descStrings(first.descriptors); !slices.Equal(got, tt.want) {
				t.Fatalf("descriptors %q, want %q", got, tt.want)
			}
			for i := range n {
				out := first
				if i > 0 {
					out = x.send(t, tt.req(i))
				}
				if !out.reply.upstream {
					t.Fatalf("request %d of %d: %+v, want it admitted", i+1, n, out.reply)
				}
			}

			over := x.send(t, tt.req(n))
			wantStatus, wantGRPC := 429, ""
			if tt.grpc {
				wantStatus, wantGRPC = 200, "8"
			}
			if over.reply.upstream || over.reply.status != wantStatus || over.reply.headers["grpc-status"] != wantGRPC {
				t.Fatalf("request %d: %+v, want a local reply %d with grpc-status %q", n+1, over.reply, wantStatus, wantGRPC)
			}
			var tripped, longest time.Duration
			for i, st := range over.resp.GetStatuses() {
				matched := config.Match(cfg, e.filter.GetDomain(), over.descriptors[i].GetEntries())
				if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
					continue
				}
				longest = max(longest, st.GetDurationUntilReset().AsDuration())
				if matched.Name != tt.rule {
					t.Errorf("descriptor %s over limit (rule %s), want only rule %s", descString(over.descriptors[i]), matched.Name, tt.rule)
					continue
				}
				tripped = st.GetDurationUntilReset().AsDuration()
				if cl := st.GetCurrentLimit(); cl.GetName() != tt.rule || cl.GetRequestsPerUnit() != rule.RequestsPerUnit {
					t.Errorf("current_limit %v, want %s %d", cl, tt.rule, n)
				}
			}
			// A sliding counter still weighs the previous window: its wait can
			// pass one window, never two.
			if tripped <= 0 || tripped > 2*rule.Window() {
				t.Fatalf("rule %s: duration_until_reset %v, want in (0, %v]", tt.rule, tripped, 2*rule.Window())
			}
			retry, err := strconv.Atoi(over.reply.headers["retry-after"])
			if want := int(math.Ceil(longest.Seconds())); err != nil || retry != max(want, 1) {
				t.Fatalf("retry-after %q, want %d (duration_until_reset %v)", over.reply.headers["retry-after"], want, longest)
			}

			if out := x.send(t, tt.other); !out.reply.upstream {
				t.Errorf("other identity %v: %+v, want admitted", tt.other, out.reply)
			}
			// A client that waits as told gets through.
			x.set(x.now.Add(time.Duration(retry) * time.Second))
			if out := x.send(t, tt.req(n)); !out.reply.upstream {
				t.Errorf("retry after %ds: %+v, want admitted", retry, out.reply)
			}
		})
	}
}

// TestEnvoyTokenBudget is the two-phase token pattern: before routing, a
// check of the user's budget with hits_addend 0; when the stream is done, the
// tokens the app reported, as the descriptor's hits_addend. A response that
// overdraws the budget is recorded, later requests get 429 until the
// announced wait has passed; a request limited before routing reports
// nothing.
func TestEnvoyTokenBudget(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	budget := ruleNamed(t, cfg, "tokens_per_user")
	x := newRig(t, e, cfg)
	req := func(u string) request {
		return request{"POST", "/llm/v1/chat", map[string]string{"x-user-id": u}, "198.51.100.50"}
	}
	used := func(n uint64) map[string]string { return map[string]string{"x-tokens-used": strconv.FormatUint(n, 10)} }

	// The request-time descriptor checks without consuming.
	first := x.send(t, req("dana"))
	if d := first.descriptors[0]; descString(d) != "tokens_user=dana" || d.GetHitsAddend() == nil || d.GetHitsAddend().GetValue() != 0 {
		t.Fatalf("request-time descriptor %v, want tokens_user=dana with hits_addend 0", d)
	}
	if !first.reply.upstream || first.resp.GetStatuses()[0].GetLimitRemaining() != budget.RequestsPerUnit {
		t.Fatalf("first request: %+v %v, want admitted with the whole budget left", first.reply, first.resp)
	}
	// The app used 1.2 times the budget: recorded when the stream is done.
	over := uint64(budget.RequestsPerUnit) * 6 / 5
	ds := x.finish(t, first, used(over))
	if len(ds) != 1 || descString(ds[0]) != "tokens_user=dana" || ds[0].GetHitsAddend().GetValue() != over {
		t.Fatalf("stream-done descriptors %v, want tokens_user=dana with hits_addend %d", ds, over)
	}
	denied := x.send(t, req("dana"))
	if denied.reply.upstream || denied.reply.status != 429 {
		t.Fatalf("after an overdrawn budget: %+v, want 429", denied.reply)
	}
	retry, err := strconv.Atoi(denied.reply.headers["retry-after"])
	if err != nil || retry < 1 || time.Duration(retry)*time.Second > 2*budget.Window() {
		t.Fatalf("retry-after %q, want a wait within two windows", denied.reply.headers["retry-after"])
	}
	// A request limited before routing reaches no app: nothing to report.
	if ds := x.finish(t, denied, used(5)); len(ds) != 0 {
		t.Fatalf("stream-done descriptors of a 429: %v, want none", ds)
	}
	if out := x.send(t, req("erin")); !out.reply.upstream {
		t.Fatalf("another user: %+v, want admitted", out.reply)
	}
	// Waiting as told gets through again.
	x.set(x.now.Add(time.Duration(retry) * time.Second))
	if out := x.send(t, req("dana")); !out.reply.upstream {
		t.Fatalf("after retry-after %ds: %+v, want admitted", retry, out.reply)
	}

	// Three responses of 40 % of the budget each: the third overdraws it.
	part := uint64(budget.RequestsPerUnit) * 2 / 5
	for i := range 3 {
		out := x.send(t, req("fay"))
		if !out.reply.upstream {
			t.Fatalf("request %d: %+v, want admitted", i+1, out.reply)
		}
		x.finish(t, out, used(part))
	}
	if out := x.send(t, req("fay")); out.reply.upstream || out.reply.status != 429 {
		t.Fatalf("after three reports of %d: %+v, want 429", part, out.reply)
	}
	// A response without the header reports nothing (Envoy drops the
	// descriptor whose hits_addend has no value).
	out := x.send(t, req("gus"))
	if ds := x.finish(t, out, nil); len(ds) != 0 {
		t.Fatalf("stream-done descriptors without x-tokens-used: %v, want none", ds)
	}
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// stderrLogger logs as go-redis does by default.
type stderrLogger struct{ l *log.Logger }

func (s stderrLogger) Printf(_ context.Context, format string, v ...any) {
	s.l.Output(2, fmt.Sprintf(format, v...)) //nolint:errcheck // best effort, as go-redis's own
}

// defaultRedisLogger restores go-redis's logging after a quiet test.
var defaultRedisLogger = stderrLogger{log.New(os.Stderr, "redis: ", log.LstdFlags|log.Lshortfile)}

// TestEnvoyFailures checks the two failure paths: Redis down (the service
// answers each rule by its failure_mode, and fails the call with UNAVAILABLE
// when the rules matched name none, so that Envoy's failure_mode_deny
// decides) and the service unreachable (Envoy's failure_mode_deny).
func TestEnvoyFailures(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	x := newRig(t, e, cfg)
	x.m.Close()
	redis.SetLogger(quietLogger{}) // the client would log every refused dial
	t.Cleanup(func() { redis.SetLogger(defaultRedisLogger) })
	for _, tt := range []struct {
		req      request
		status   int  // 0: admitted
		deferred bool // the service answered UNAVAILABLE, Envoy's failure_mode_deny decided
	}{
		{request{"POST", "/login", map[string]string{"x-user-id": "alice"}, "203.0.113.10"}, 429, false}, // login_per_user fails closed
		{request{"POST", "/login", nil, "203.0.113.10"}, 0, true},
		{request{"POST", "/api/items", map[string]string{"x-user-id": "carol"}, "198.51.100.1"}, 0, true},
		{request{"GET", "/", nil, "198.51.100.1"}, 0, true},
	} {
		out := x.send(t, tt.req)
		if got := out.reply.status; out.reply.upstream != (tt.status == 0) || got != tt.status {
			t.Errorf("Redis down, %v: %+v, want status %d", tt.req, out.reply, tt.status)
		}
		if deferred := out.resp == nil; deferred != tt.deferred {
			t.Errorf("Redis down, %v: answer %v, want deferred to Envoy: %v", tt.req, out.resp, tt.deferred)
		}
		if tt.status != 0 && out.reply.headers["retry-after"] != "1" {
			t.Errorf("Redis down, %v: retry-after %q, want 1", tt.req, out.reply.headers["retry-after"])
		}
	}
	if r := e.reply(request{"POST", "/login", nil, "203.0.113.10"}, nil, errors.New("unavailable")); !r.upstream {
		t.Errorf("service unreachable: %+v, want the request let through (failure_mode_deny false)", r)
	}
}

// docsCentralCluster parses the central "ratelimit" cluster that
// docs/deploy.md tells users to put in place of the sidecar's.

// TestEnvoyConcurrencyLimit: the /concurrency route takes a seat before
// routing, and its answer names the seat (a lease id in dynamic_metadata);
// when the stream is done, a metadata action puts that id in the release's
// descriptor. At most the limit of one user's requests are in flight; a
// denied request has no id, so Envoy sends no release for it; a release
// frees its own seat; once every request is done, every seat is free.
func TestEnvoyConcurrencyLimit(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	limit := int(ruleNamed(t, cfg, "concurrent_per_user").RequestsPerUnit)
	x := newRig(t, e, cfg)
	req := request{"GET", "/concurrency/export", map[string]string{"x-user-id": "erin"}, "198.51.100.60"}

	var running []outcome
	for i := range limit {
		out := x.send(t, req)
		if d := out.descriptors[0]; descString(d) != "concurrent_user=erin" || d.GetHitsAddend().GetValue() != 1 || d.GetIsNegativeHits() {
			t.Fatalf("acquisition descriptor %v, want concurrent_user=erin with hits_addend 1", d)
		}
		if !out.reply.upstream {
			t.Fatalf("request %d of %d: %+v, want admitted", i+1, limit, out.reply)
		}
		running = append(running, out)
	}
	for i := range 3 {
		denied := x.send(t, req)
		if denied.reply.upstream || denied.reply.status != 429 {
			t.Fatalf("request %d over the limit: %+v, want 429", i+1, denied.reply)
		}
		// No lease id in the 429's answer: the metadata action drops the
		// release's descriptor, and Envoy calls nothing.
		if ds := x.finish(t, denied, nil); len(ds) != 0 {
			t.Fatalf("stream-done descriptors of a 429: %v, want none", descStrings(ds))
		}
	}
	// One request ends: its own seat comes back, and one more is admitted.
	ds := x.finish(t, running[0], nil)
	if len(ds) != 1 || len(ds[0].GetEntries()) != 2 || ds[0].GetEntries()[1].GetKey() != "lease" ||
		ds[0].GetEntries()[1].GetValue() == "" || ds[0].GetHitsAddend().GetValue() != 1 || !ds[0].GetIsNegativeHits() {
		t.Fatalf("stream-done descriptors of an admitted request: %v, want concurrent_user=erin, lease=<id>, is_negative_hits", descStrings(ds))
	}
	running = running[1:]
	next := x.send(t, req)
	if !next.reply.upstream {
		t.Fatalf("after one request ended: %+v, want admitted", next.reply)
	}
	running = append(running, next)
	if out := x.send(t, req); out.reply.upstream {
		t.Fatalf("the limit again in flight: %+v, want 429", out.reply)
	} else {
		x.finish(t, out, nil)
	}
	for _, out := range running {
		x.finish(t, out, nil)
	}
	if out := x.send(t, req); !out.reply.upstream || out.resp.GetStatuses()[0].GetLimitRemaining() != uint32(limit-1) {
		t.Fatalf("after every request ended: %+v %v, want admitted with %d seats left", out.reply, out.resp, limit-1)
	}
}
