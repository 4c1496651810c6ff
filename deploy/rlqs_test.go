package deploy

import (
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlqv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// quotaFilterName is the rate_limit_quota filter's name in http_filters and
// in a route's typed_per_filter_config.
const quotaFilterName = "envoy.filters.http.rate_limit_quota"

// quotaFilter returns envoy.yaml's rate_limit_quota filter entry and its
// config.
func (e *edge) quotaFilter(t *testing.T) (*hcmv3.HttpFilter, *rlqv3.RateLimitQuotaFilterConfig) {
	t.Helper()
	for _, hf := range e.hcm.GetHttpFilters() {
		if hf.GetTypedConfig().MessageIs(&rlqv3.RateLimitQuotaFilterConfig{}) {
			if hf.GetName() != quotaFilterName {
				t.Fatalf("the rate_limit_quota filter is named %q, want %q", hf.GetName(), quotaFilterName)
			}
			return hf, unpack(t, hf.GetTypedConfig(), &rlqv3.RateLimitQuotaFilterConfig{})
		}
	}
	t.Fatalf("%s has no %s filter", envoyFile, quotaFilterName)
	return nil, nil
}

// quotaEnabled tells whether the rate_limit_quota filter runs on route rt, as
// Envoy's route-based filter chain decides: the filter is disabled in
// http_filters, and a route enables it with a FilterConfig whose config is
// empty. Any other typed_per_filter_config is not modelled: Envoy's filter
// takes no per-route RateLimitQuotaOverride (its factory returns none, and
// Envoy refuses such a route config).
func (e *edge) quotaEnabled(t *testing.T, rt *routev3.Route) bool {
	t.Helper()
	hf, _ := e.quotaFilter(t)
	if !hf.GetDisabled() {
		t.Fatalf("%s: the emulator models the filter disabled by default, enabled per route", quotaFilterName)
	}
	enabled := false
	for name, a := range rt.GetTypedPerFilterConfig() {
		fc := &routev3.FilterConfig{}
		if name != quotaFilterName || !a.MessageIs(fc) {
			t.Fatalf("route %s: typed_per_filter_config %s (%s): the emulator models a FilterConfig of %s only",
				rt.GetName(), name, a.GetTypeUrl(), quotaFilterName)
		}
		unpack(t, a, fc)
		if fc.GetIsOptional() || fc.GetConfig().GetTypeUrl() != "" {
			t.Fatalf("route %s: %s: an override or an optional filter is not modelled (Envoy's filter has no per-route config)",
				rt.GetName(), name)
		}
		enabled = !fc.GetDisabled()
	}
	return enabled
}

// quotaResult is what the rate_limit_quota filter does with a request before
// any assignment: the bucket it counts the request in, or none.
type quotaResult struct {
	action   string // the matched action's name ("" when nothing matched)
	settings *rlqv3.RateLimitQuotaBucketSettings
	bucket   map[string]string // nil: the request passes uncounted
}

// evalQuota mirrors the filter's decodeHeaders and its matcher for the subset
// envoy.yaml uses: a matcher_list of single predicates on a request header
// (first match wins), else on_no_match; then the bucket id built from the
// action's bucket_id_builder.
func evalQuota(t *testing.T, m *xdsmatcherv3.Matcher, r request) quotaResult {
	t.Helper()
	onMatch := m.GetOnNoMatch()
	if m.GetMatcherTree() != nil {
		t.Fatal("the emulator does not model matcher_tree")
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		if predicateMatches(t, fm.GetPredicate(), r) {
			onMatch = fm.GetOnMatch()
			break
		}
	}
	if onMatch == nil { // Envoy: no match, the request passes and is not reported
		return quotaResult{}
	}
	if onMatch.GetMatcher() != nil || onMatch.GetKeepMatching() {
		t.Fatal("the emulator does not model nested matchers or keep_matching")
	}
	action := onMatch.GetAction()
	settings := unpack(t, action.GetTypedConfig(), &rlqv3.RateLimitQuotaBucketSettings{})
	return quotaResult{action: action.GetName(), settings: settings, bucket: bucketID(t, settings, r)}
}

func predicateMatches(t *testing.T, p *xdsmatcherv3.Matcher_MatcherList_Predicate, r request) bool {
	t.Helper()
	sp := p.GetSinglePredicate()
	if sp == nil || sp.GetCustomMatch() != nil {
		t.Fatalf("predicate %v: the emulator models a single_predicate with value_match only", p)
	}
	v, present := headerInput(t, sp.GetInput().GetTypedConfig(), r)
	if !present { // no data: Envoy's string matcher does not match
		return false
	}
	return xdsStringMatches(t, sp.GetValueMatch(), v)
}

// headerInput reads an HttpRequestHeaderMatchInput from r.
func headerInput(t *testing.T, a *anypb.Any, r request) (string, bool) {
	t.Helper()
	in := &matcherv3.HttpRequestHeaderMatchInput{}
	if !a.MessageIs(in) {
		t.Fatalf("input %s: the emulator models HttpRequestHeaderMatchInput only", a.GetTypeUrl())
	}
	return r.header(strings.ToLower(unpack(t, a, in).GetHeaderName()))
}

func xdsStringMatches(t *testing.T, m *xdsmatcherv3.StringMatcher, v string) bool {
	t.Helper()
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *xdsmatcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *xdsmatcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *xdsmatcherv3.StringMatcher_SafeRegex: // RE2, matching the whole value
		re, err := regexp.Compile(`^(?:` + p.SafeRegex.GetRegex() + `)$`)
		if err != nil {
			t.Fatalf("safe_regex %q: %v", p.SafeRegex.GetRegex(), err)
		}
		return re.MatchString(v)
	default:
		t.Fatalf("the emulator does not model string matcher %T", p)
		return false
	}
}

// bucketID is the filter's generateBucketId: a string_value as is; a
// custom_value read from the request, where a missing header fails the
// request's bucket (nil: it passes uncounted) and an empty value omits the
// key.
func bucketID(t *testing.T, s *rlqv3.RateLimitQuotaBucketSettings, r request) map[string]string {
	t.Helper()
	id := map[string]string{}
	for key, vb := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
		switch b := vb.GetValueSpecifier().(type) {
		case *rlqv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_StringValue:
			id[key] = b.StringValue
		case *rlqv3.RateLimitQuotaBucketSettings_BucketIdBuilder_ValueBuilder_CustomValue:
			v, present := headerInput(t, b.CustomValue.GetTypedConfig(), r)
			if !present {
				return nil
			}
			if v != "" {
				id[key] = v
			}
		default:
			t.Fatalf("bucket_id_builder %s: the emulator does not model %T", key, b)
		}
	}
	return id
}

// quotaActions returns every action of the filter's bucket_matchers, by name.
func quotaActions(t *testing.T, m *xdsmatcherv3.Matcher) map[string]*rlqv3.RateLimitQuotaBucketSettings {
	t.Helper()
	actions := map[string]*rlqv3.RateLimitQuotaBucketSettings{}
	add := func(om *xdsmatcherv3.Matcher_OnMatch) {
		if om == nil {
			return
		}
		a := om.GetAction()
		if a.GetName() == "" || actions[a.GetName()] != nil {
			t.Fatalf("bucket_matchers action %q: each action needs a name of its own (the rule it resolves to)", a.GetName())
		}
		actions[a.GetName()] = unpack(t, a.GetTypedConfig(), &rlqv3.RateLimitQuotaBucketSettings{})
	}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		add(fm.GetOnMatch())
	}
	add(m.GetOnNoMatch())
	return actions
}

// wholeSeconds: Envoy reads durations of this filter as whole seconds
// (assignment TTL, fallback timeout) or truncates them (fill_interval).
func wholeSeconds(d interface{ AsDuration() time.Duration }) bool {
	return d.AsDuration() >= time.Second && d.AsDuration()%time.Second == 0
}

// TestQuotaFilterConfig checks the rate_limit_quota filter of envoy.yaml
// against what Envoy's client does (docs/rlqs.md): the service's cluster and
// domain, each bucket's settings, and that only the /quota route runs it.
func TestQuotaFilterConfig(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	cfg := loadRules(t)
	hf, f := e.quotaFilter(t)

	got, want := f.GetRlqsServer().GetEnvoyGrpc().GetClusterName(), e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if got != want {
		t.Errorf("rlqs_server cluster %q, want the rate limit service's %q", got, want)
	}
	if f.GetRlqsServer().GetTimeout() != nil {
		t.Error("rlqs_server has a timeout: it would end the long-lived stream")
	}
	if !cfg.HasDomain(f.GetDomain()) || f.GetDomain() != e.filter.GetDomain() {
		t.Errorf("domain %q: want the ratelimit filter's %q, a domain of %s", f.GetDomain(), e.filter.GetDomain(), rulesDir)
	}
	// Fields Envoy's filter does not read: setting them would promise what
	// does not happen.
	if f.GetFilterEnabled() != nil || f.GetFilterEnforced() != nil || len(f.GetRequestHeadersToAddWhenNotEnforced()) > 0 {
		t.Error("filter_enabled, filter_enforced or request_headers_to_add_when_not_enforced set: Envoy's filter ignores them")
	}
	if !hf.GetDisabled() {
		t.Error("the filter is not disabled in http_filters: it would apply to every route")
	}

	// The validation reaches into the matcher tree: an action's settings,
	// and the header input of a bucket_id_builder inside it.
	for _, broken := range []struct{ after, from, to, field string }{
		{"expired_assignment_behavior:", "fill_interval: 1s", "fill_interval: 0s", "FillInterval"},
		{"custom_value:", "header_name: x-user-id", `header_name: "x\ny"`, "HeaderName"},
	} {
		text := string(readFile(t, envoyFile))
		at := strings.Index(text, broken.after)
		if at < 0 || !strings.Contains(text[at:], broken.from) {
			t.Fatalf("%s: no %q after %q to break", envoyFile, broken.from, broken.after)
		}
		bb := &bootstrapv3.Bootstrap{}
		if err := unmarshalEnvoy([]byte(text[:at]+strings.Replace(text[at:], broken.from, broken.to, 1)), bb); err != nil {
			t.Fatal(err)
		}
		bc := &schemaCheck{}
		bc.validate(bb, "bootstrap")
		if len(bc.errs) == 0 || !strings.Contains(errors.Join(bc.errs...).Error(), broken.field) {
			t.Errorf("%q in the quota filter passed validation: %v", broken.to, bc.errs)
		}
	}

	actions := quotaActions(t, f.GetBucketMatchers())
	if len(actions) == 0 {
		t.Fatal("bucket_matchers has no action")
	}
	for name, s := range actions {
		t.Run(name, func(t *testing.T) {
			rule := ruleNamed(t, cfg, name)
			if ri := s.GetReportingInterval(); ri.AsDuration() != 5*time.Second {
				t.Errorf("reporting_interval %v: Envoy reports every 5 s whatever it says; say 5s", ri.AsDuration())
			}
			na := s.GetNoAssignmentBehavior().GetFallbackRateLimit()
			if na.GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL {
				t.Errorf("no_assignment_behavior %v: want ALLOW_ALL (a token bucket there crashes Envoy)", na)
			}
			ea := s.GetExpiredAssignmentBehavior()
			tb := ea.GetFallbackRateLimit().GetTokenBucket()
			if tb == nil {
				t.Fatalf("expired_assignment_behavior %v: want a fallback_rate_limit token_bucket (reuse_last_assignment is not implemented)", ea)
			}
			if !wholeSeconds(tb.GetFillInterval()) || tb.GetTokensPerFill() == nil {
				t.Errorf("fallback token bucket %v: want fill_interval in whole seconds and tokens_per_fill set", tb)
			}
			// The floor refills, per Envoy, at most a tenth of the rule's limit
			// per window: up to 10 Envoys on it stay within the rule.
			refill := uint64(tb.GetTokensPerFill().GetValue()) * uint64(rule.Window()/tb.GetFillInterval().AsDuration())
			if refill*10 > uint64(rule.RequestsPerUnit) {
				t.Errorf("fallback %v refills %d per %v, more than a tenth of rule %s's %d", tb, refill, rule.Window(), name, rule.RequestsPerUnit)
			}
			if to := ea.GetExpiredAssignmentBehaviorTimeout(); to == nil || !wholeSeconds(to) {
				t.Errorf("expired_assignment_behavior_timeout %v: unset ends the fallback at once; Envoy reads whole seconds", to)
			}
			deny := s.GetDenyResponseSettings()
			if deny.GetHttpStatus().GetCode() != typev3.StatusCode_TooManyRequests || deny.GetGrpcStatus().GetCode() != 8 {
				t.Errorf("deny_response_settings %v: want 429 and gRPC RESOURCE_EXHAUSTED (8)", deny)
			}
		})
	}

	// Only the /quota route enables the filter.
	for _, rt := range e.vhost.GetRoutes() {
		if on := e.quotaEnabled(t, rt); on != (rt.GetName() == "quota") {
			t.Errorf("route %s: quota filter enabled %v", rt.GetName(), on)
		}
		if rt.GetName() == "quota" && len(rt.GetRoute().GetRateLimits()) > 0 {
			t.Error("route quota has rate_limits: ShouldRateLimit would be on its request path again")
		}
	}
}

// TestQuotaBuckets runs requests through the emulated listener and the quota
// filter's bucket_matchers, and checks the bucket each lands in.
func TestQuotaBuckets(t *testing.T) {
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	_, f := e.quotaFilter(t)
	user := func(u string) map[string]string { return map[string]string{"x-user-id": u} }
	for _, tt := range []struct {
		name   string
		req    request
		route  string
		action string // "" when the filter does not run or matches nothing
		bucket map[string]string
	}{
		{"user", request{"GET", "/quota/items", user("alice"), "198.51.100.70"}, "quota", "quota_per_user",
			map[string]string{"name": "quota", "user": "alice"}},
		{"route root, upper case", request{"POST", "/QUOTA", user("bob"), "198.51.100.70"}, "quota", "quota_per_user",
			map[string]string{"name": "quota", "user": "bob"}},
		{"dot segments", request{"GET", "/api/../quota/x", user("alice"), "198.51.100.70"}, "quota", "quota_per_user",
			map[string]string{"name": "quota", "user": "alice"}},
		{"no user shares one bucket", request{"GET", "/quota/items", nil, "198.51.100.71"}, "quota", "quota_anonymous",
			map[string]string{"name": "quota"}},
		{"empty user shares it too", request{"GET", "/quota/items", user(""), "198.51.100.72"}, "quota", "quota_anonymous",
			map[string]string{"name": "quota"}},
		{"not the route", request{"GET", "/quotax", user("alice"), "198.51.100.70"}, "default", "", nil},
		{"another route", request{"GET", "/api/items", user("alice"), "198.51.100.70"}, "api", "", nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			em := e.emulate(t, tt.req)
			if em.route != tt.route {
				t.Fatalf("route %q, want %q", em.route, tt.route)
			}
			if tt.route == "quota" && len(em.descriptors) > 0 {
				t.Errorf("descriptors %q on the quota route: the ratelimit filter would call the service", descStrings(em.descriptors))
			}
			var got quotaResult
			if em.quota {
				got = evalQuota(t, f.GetBucketMatchers(), em.req)
			}
			if got.action != tt.action || !maps.Equal(got.bucket, tt.bucket) {
				t.Errorf("action %q bucket %v, want %q %v", got.action, got.bucket, tt.action, tt.bucket)
			}
		})
	}
	// The evaluator follows the builder: a missing custom_value header fails
	// the bucket, and Envoy lets the request pass uncounted.
	perUser := quotaActions(t, f.GetBucketMatchers())["quota_per_user"]
	if id := bucketID(t, perUser, request{"GET", "/quota", nil, "198.51.100.70"}); id != nil {
		t.Errorf("bucket id without x-user-id: %v, want none", id)
	}
}

// TestRLQSDocFilter: docs/rlqs.md's blocks are envoy.yaml's quota filter and
// the route that enables it, field for field.
func TestRLQSDocFilter(t *testing.T) {
	const doc = "../docs/rlqs.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	want, _ := e.quotaFilter(t)
	filter := &hcmv3.HttpFilter{}
	filterBlock := fencedBlock(t, doc, "# the quota filter: an http_filters entry, disabled unless a route enables it")
	if err := unmarshalEnvoy([]byte(filterBlock), filter); err != nil {
		t.Fatalf("%s: filter: %v", doc, err)
	}
	route := &routev3.Route{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the route that enables the quota filter")), route); err != nil {
		t.Fatalf("%s: route: %v", doc, err)
	}
	for _, m := range []proto.Message{filter, route} {
		check := &schemaCheck{}
		check.validate(m, string(m.ProtoReflect().Descriptor().Name()))
		for _, err := range check.errs {
			t.Errorf("%s: %v", doc, err)
		}
	}
	if !proto.Equal(filter, want) {
		t.Errorf("%s: the quota filter differs from %s's", doc, envoyFile)
	}
	i := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == route.GetName() })
	if i < 0 || !proto.Equal(e.vhost.GetRoutes()[i], route) {
		t.Errorf("%s: route %s differs from %s's", doc, route.GetName(), envoyFile)
	}
}
