package deploy

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ---------------------------------------------------------------------------
// The parts of the bootstrap that decide rate limits.

// edge is what envoy.yaml says about a request on its listener.
type edge struct {
	listenerPort uint32
	hcm          *hcmv3.HttpConnectionManager
	vhost        *routev3.VirtualHost
	filter       *ratelimitv3.RateLimit
	toMetadata   *h2mv3.Config // header_to_metadata, or nil
	filterNames  []string
	clusters     map[string]*clusterv3.Cluster
	admin        *corev3.SocketAddress
}

func unpack[M proto.Message](t *testing.T, a *anypb.Any, m M) M {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("typed_config %s: %v", a.GetTypeUrl(), err)
	}
	return m
}

// newEdge extracts the one listener, connection manager and virtual host the
// emulator knows how to read; anything else fails, so that a change the
// emulator cannot follow is not silently ignored.
func newEdge(t *testing.T, b *bootstrapv3.Bootstrap) *edge {
	t.Helper()
	e := &edge{clusters: map[string]*clusterv3.Cluster{}, admin: b.GetAdmin().GetAddress().GetSocketAddress()}
	for _, c := range b.GetStaticResources().GetClusters() {
		e.clusters[c.GetName()] = c
	}
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].GetFilterChains()) != 1 || len(ls[0].GetFilterChains()[0].GetFilters()) != 1 {
		t.Fatal("the emulator reads one listener with one filter chain of one filter")
	}
	e.listenerPort = ls[0].GetAddress().GetSocketAddress().GetPortValue()
	f := ls[0].GetFilterChains()[0].GetFilters()[0]
	e.hcm = unpack(t, f.GetTypedConfig(), &hcmv3.HttpConnectionManager{})
	rc := e.hcm.GetRouteConfig()
	if rc == nil || len(rc.GetVirtualHosts()) != 1 {
		t.Fatal("the emulator reads an inline route_config with one virtual host")
	}
	e.vhost = rc.GetVirtualHosts()[0]
	if !slices.Equal(e.vhost.GetDomains(), []string{"*"}) || len(e.vhost.GetRateLimits()) > 0 || len(e.vhost.GetTypedPerFilterConfig()) > 0 {
		t.Fatal(`the emulator reads a virtual host of domains ["*"] without rate_limits or typed_per_filter_config`)
	}
	for _, hf := range e.hcm.GetHttpFilters() {
		e.filterNames = append(e.filterNames, hf.GetName())
		if hf.GetTypedConfig().MessageIs(&ratelimitv3.RateLimit{}) {
			if e.filter != nil {
				t.Fatal("more than one rate limit filter")
			}
			e.filter = unpack(t, hf.GetTypedConfig(), &ratelimitv3.RateLimit{})
		}
		if hf.GetTypedConfig().MessageIs(&h2mv3.Config{}) {
			e.toMetadata = unpack(t, hf.GetTypedConfig(), &h2mv3.Config{})
			if len(e.toMetadata.GetRequestRules()) > 0 {
				t.Fatal("the emulator models header_to_metadata's response_rules only")
			}
		}
	}
	if e.filter == nil {
		t.Fatal("no envoy.extensions.filters.http.ratelimit.v3.RateLimit filter")
	}
	// Fields that would change which descriptors are sent, or whether
	// decisions are enforced, and that the emulator does not model.
	if len(e.filter.GetRateLimits()) > 0 || e.filter.GetFilterEnabled() != nil || e.filter.GetFilterEnforced() != nil ||
		e.filter.GetFailureModeDenyPercent() != nil || (e.filter.GetRequestType() != "" && e.filter.GetRequestType() != "both") {
		t.Fatal("the emulator does not model rate_limits, filter_enabled, filter_enforced, failure_mode_deny_percent or request_type on the filter")
	}
	if !e.hcm.GetUseRemoteAddress().GetValue() || e.hcm.GetXffNumTrustedHops() != 0 || e.hcm.GetOriginalIpDetectionExtensions() != nil {
		t.Fatal("the emulator takes remote_address from the TCP peer: use_remote_address true, xff_num_trusted_hops 0")
	}
	return e
}

// ---------------------------------------------------------------------------
// An emulator of Envoy's route matching and rate limit actions.

// request is what a client sends to Envoy's listener.
type request struct {
	method  string
	path    string            // :path as sent, query included
	headers map[string]string // names in lower case
	client  string            // the TCP peer's address
}

func (r request) String() string {
	return fmt.Sprintf("%s %s %v from %s", r.method, r.path, r.headers, r.client)
}

func (r request) grpc() bool { return strings.HasPrefix(r.headers["content-type"], "application/grpc") }

// header returns a header as Envoy's HeaderMap holds it.
func (r request) header(name string) (string, bool) {
	switch name {
	case ":method":
		return r.method, true
	case ":path":
		return r.path, true
	}
	v, ok := r.headers[name]
	return v, ok
}

// emulated is what Envoy does with a request up to the rate limit call.
type emulated struct {
	rejected    int    // a status Envoy answers with before routing (400), or 0
	route       string // the matched route's name; "" when none matched (404)
	descriptors []*rlcommon.RateLimitDescriptor
	matched     *routev3.Route // the route, for the stream-done call
	quota       bool           // the rate_limit_quota filter runs on the route (rlqs_test.go)
	req         request        // the request as routed (path normalized)
}

// emulate mirrors Envoy: connection manager checks and path normalization,
// first matching route in order, then that route's rate_limits of the
// filter's stage, each turned into a descriptor by its actions in order.
func (e *edge) emulate(t *testing.T, r request) emulated {
	t.Helper()
	if e.hcm.GetCommonHttpProtocolOptions().GetHeadersWithUnderscoresAction() == corev3.HttpProtocolOptions_REJECT_REQUEST {
		for name := range r.headers {
			if strings.Contains(name, "_") {
				return emulated{rejected: 400}
			}
		}
	}
	path, ok := e.normalize(t, r.path)
	if !ok {
		return emulated{rejected: 400}
	}
	r.path = path
	for _, rt := range e.vhost.GetRoutes() {
		if !routeMatches(t, rt.GetMatch(), path) {
			continue
		}
		out := emulated{route: rt.GetName(), matched: rt, req: r, quota: e.quotaEnabled(t, rt)}
		out.descriptors = e.descriptors(t, rt, r, false, nil, nil)
		return out
	}
	return emulated{}
}

// descriptors runs the route's rate_limits of the filter's stage and of one
// phase, as Envoy's populateRateLimitDescriptors does: before routing
// (streamDone false) or when the stream is done, with the dynamic metadata
// the stream gathered (namespace, then key), and rl, the dynamic_metadata of
// the rate limit service's first answer, which the filter's complete()
// stored under its namespace envoy.filters.http.ratelimit (nil: none).
func (e *edge) descriptors(t *testing.T, rt *routev3.Route, r request, streamDone bool,
	metadata map[string]map[string]string, rl *structpb.Struct) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	return phaseDescriptors(t, "route "+rt.GetName(), rt.GetRoute().GetRateLimits(), e.filter.GetStage(), r, streamDone, metadata, rl)
}

// phaseDescriptors is descriptors on a list of rate_limits entries (a
// route's, or a RateLimitPerRoute's), of the filter's stage; where names the
// list in messages.
func phaseDescriptors(t *testing.T, where string, rls []*routev3.RateLimit, stage uint32, r request, streamDone bool,
	metadata map[string]map[string]string, rl *structpb.Struct) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var ds []*rlcommon.RateLimitDescriptor
	rlNamespace := rl
	for i, rl := range rls {
		if rl.GetStage().GetValue() != stage || rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		if rl.GetLimit() != nil || rl.GetDisableKey() != "" {
			t.Fatalf("%s rate_limits[%d]: the emulator does not model limit or disable_key", where, i)
		}
		d := descriptorWith(t, rl.GetActions(), r, rlNamespace)
		if d == nil {
			continue
		}
		if ha := rl.GetHitsAddend(); ha != nil {
			cost, ok := hitsAddend(t, ha, metadata)
			if !ok { // Envoy logs "Invalid hits_addend" and drops the descriptor
				continue
			}
			d.HitsAddend = wrapperspb.UInt64(cost)
			d.IsNegativeHits = ha.GetIsNegativeHits()
		}
		ds = append(ds, d)
	}
	return ds
}

// dynamicMetadata is the one substitution the emulator models in a
// hits_addend format: %DYNAMIC_METADATA(namespace:key)%.
var dynamicMetadata = regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:()]+):([^:()]+)\)%$`)

// maxHitsAddend is Envoy's bound on a hits_addend read from a format.
const maxHitsAddend = 1e9

// hitsAddend is a rate_limits entry's hits_addend, as Envoy's
// RateLimitPolicyEntryImpl computes it: a number, or a format's value parsed
// as a number from 0 to 1e9; ok is false when Envoy would drop the
// descriptor (the metadata absent, or not such a number).
func hitsAddend(t *testing.T, ha *routev3.RateLimit_HitsAddend, metadata map[string]map[string]string) (uint64, bool) {
	t.Helper()
	if ha.GetFormat() == "" {
		return ha.GetNumber().GetValue(), true
	}
	m := dynamicMetadata.FindStringSubmatch(ha.GetFormat())
	if m == nil {
		t.Fatalf("hits_addend format %q: the emulator models %%DYNAMIC_METADATA(namespace:key)%% only", ha.GetFormat())
	}
	v, present := metadata[m[1]][m[2]]
	if !present {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > maxHitsAddend {
		return 0, false
	}
	return uint64(f), true
}

// streamDone mirrors the filter's onDestroy: the route's apply_on_stream_done
// rate_limits, with the dynamic metadata that header_to_metadata took from
// the response headers (nil when the app never answered).
func (e *edge) streamDone(t *testing.T, out emulated, response map[string]string,
	answer *structpb.Struct) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	if out.matched == nil {
		return nil
	}
	metadata := map[string]map[string]string{}
	for _, rule := range e.toMetadata.GetResponseRules() {
		kv := rule.GetOnHeaderPresent()
		if rule.GetCookie() != "" || rule.GetOnHeaderMissing() != nil || kv.GetValue() != "" || kv.GetRegexValueRewrite() != nil ||
			kv.GetType() != h2mv3.Config_STRING || kv.GetEncode() != h2mv3.Config_NONE {
			t.Fatalf("header_to_metadata rule %v: the emulator models on_header_present of a header, as a STRING", rule)
		}
		v, ok := response[strings.ToLower(rule.GetHeader())]
		if !ok || v == "" {
			continue
		}
		ns := cmpOr(kv.GetMetadataNamespace(), "envoy.filters.http.header_to_metadata")
		if metadata[ns] == nil {
			metadata[ns] = map[string]string{}
		}
		metadata[ns][kv.GetKey()] = v
	}
	return e.descriptors(t, out.matched, out.req, true, metadata, answer)
}

// normalize applies the connection manager's path settings to :path, or
// reports that Envoy rejects it.
func (e *edge) normalize(t *testing.T, p string) (string, bool) {
	t.Helper()
	path, query, hasQuery := strings.Cut(p, "?")
	switch e.hcm.GetPathWithEscapedSlashesAction() {
	case hcmv3.HttpConnectionManager_REJECT_REQUEST:
		lower := strings.ToLower(path)
		if strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") {
			return "", false
		}
	case hcmv3.HttpConnectionManager_KEEP_UNCHANGED, hcmv3.HttpConnectionManager_IMPLEMENTATION_SPECIFIC_DEFAULT:
	default:
		t.Fatalf("the emulator does not model path_with_escaped_slashes_action %v", e.hcm.GetPathWithEscapedSlashesAction())
	}
	if e.hcm.GetNormalizePath().GetValue() {
		path = removeDotSegments(path)
	}
	if e.hcm.GetMergeSlashes() {
		for strings.Contains(path, "//") {
			path = strings.ReplaceAll(path, "//", "/")
		}
	}
	if hasQuery {
		path += "?" + query
	}
	return path, true
}

// removeDotSegments is RFC 3986 section 5.2.4 on an absolute path.
func removeDotSegments(p string) string {
	segs := strings.Split(p, "/")[1:]
	var out []string
	for i, s := range segs {
		last := i == len(segs)-1
		switch s {
		case ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, s)
			continue
		}
		if last { // "/a/." and "/a/.." end with a slash
			out = append(out, "")
		}
	}
	return "/" + strings.Join(out, "/")
}

func routeMatches(t *testing.T, m *routev3.RouteMatch, path string) bool {
	t.Helper()
	if len(m.GetHeaders()) > 0 || len(m.GetQueryParameters()) > 0 || len(m.GetCookies()) > 0 || m.GetGrpc() != nil ||
		m.GetRuntimeFraction() != nil || m.GetTlsContext() != nil || len(m.GetDynamicMetadata()) > 0 || len(m.GetFilterState()) > 0 {
		t.Fatalf("route match %v: the emulator only models path matching", m)
	}
	sensitive := m.GetCaseSensitive() == nil || m.GetCaseSensitive().GetValue()
	equal := func(a, b string) bool {
		if sensitive {
			return a == b
		}
		return strings.EqualFold(a, b)
	}
	hasPrefix := func(s, prefix string) bool { return len(s) >= len(prefix) && equal(s[:len(prefix)], prefix) }
	noQuery, _, _ := strings.Cut(path, "?")
	noQuery, _, _ = strings.Cut(noQuery, "#") // Envoy's removeQueryAndFragment
	switch ps := m.GetPathSpecifier().(type) {
	case *routev3.RouteMatch_Prefix: // on the whole :path
		return hasPrefix(path, ps.Prefix)
	case *routev3.RouteMatch_Path: // on the path without the query
		return equal(noQuery, ps.Path)
	case *routev3.RouteMatch_PathSeparatedPrefix: // the prefix, then the end or "/"
		p := ps.PathSeparatedPrefix
		return hasPrefix(noQuery, p) && (len(noQuery) == len(p) || noQuery[len(p)] == '/')
	default:
		t.Fatalf("the emulator does not model path specifier %T", ps)
		return false
	}
}

// descriptor runs one rate_limits entry's actions in order, as Envoy's
// RateLimitPolicyEntryImpl does: an action that cannot produce its entry drops
// the whole descriptor (nil).
func descriptor(t *testing.T, actions []*routev3.RateLimit_Action, r request) *rlcommon.RateLimitDescriptor {
	t.Helper()
	return descriptorWith(t, actions, r, nil)
}

// rlFilterNamespace is where Envoy's rate limit filter stores the dynamic
// metadata of the service's answer (ratelimit.cc, Filter::complete).
const rlFilterNamespace = "envoy.filters.http.ratelimit"

// descriptorWith is descriptor with rl, the rate limit filter's dynamic
// metadata, for a metadata action of source DYNAMIC, as Envoy's
// MetaDataAction::populateDescriptor reads it (router_ratelimit.cc): the
// string value at metadata_key's path; empty or absent, default_value if
// set; else skip_if_absent skips the entry, and without it the whole
// descriptor is dropped.
func descriptorWith(t *testing.T, actions []*routev3.RateLimit_Action, r request, rl *structpb.Struct) *rlcommon.RateLimitDescriptor {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range actions {
		switch s := a.GetActionSpecifier().(type) {
		case *routev3.RateLimit_Action_RemoteAddress_:
			ip, err := netip.ParseAddr(r.client)
			if err != nil { // not an IP peer (a pipe): no entry, no descriptor
				return nil
			}
			add("remote_address", ip.String())
		case *routev3.RateLimit_Action_GenericKey_:
			add(cmpOr(s.GenericKey.GetDescriptorKey(), "generic_key"), s.GenericKey.GetDescriptorValue())
		case *routev3.RateLimit_Action_RequestHeaders_:
			v, ok := r.header(strings.ToLower(s.RequestHeaders.GetHeaderName()))
			if !ok {
				if s.RequestHeaders.GetSkipIfAbsent() {
					continue
				}
				return nil
			}
			add(s.RequestHeaders.GetDescriptorKey(), v)
		case *routev3.RateLimit_Action_HeaderValueMatch_:
			hv := s.HeaderValueMatch
			expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
			if headersMatch(t, hv.GetHeaders(), r) != expect {
				return nil
			}
			add(cmpOr(hv.GetDescriptorKey(), "header_match"), hv.GetDescriptorValue())
		case *routev3.RateLimit_Action_Metadata:
			md := s.Metadata
			if md.GetSource() != routev3.RateLimit_Action_MetaData_DYNAMIC || md.GetMetadataKey().GetKey() != rlFilterNamespace {
				t.Fatalf("metadata action %v: the emulator models source DYNAMIC in namespace %s only", md, rlFilterNamespace)
			}
			v := structpb.NewStructValue(rl)
			for _, seg := range md.GetMetadataKey().GetPath() {
				v = v.GetStructValue().GetFields()[seg.GetKey()]
			}
			switch value := v.GetStringValue(); {
			case value != "":
				add(md.GetDescriptorKey(), value)
			case md.GetDefaultValue() != "":
				add(md.GetDescriptorKey(), md.GetDefaultValue())
			case md.GetSkipIfAbsent():
				continue
			default:
				return nil
			}
		default:
			t.Fatalf("the emulator does not model rate limit action %T", s)
		}
	}
	if len(d.Entries) == 0 { // every action skipped: not modelled, and not wanted
		t.Fatalf("rate_limits entry %v produced a descriptor without entries for %v", actions, r)
	}
	return d
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// headersMatch is Envoy's HeaderUtility::matchHeaders: every matcher must
// match.
func headersMatch(t *testing.T, ms []*routev3.HeaderMatcher, r request) bool {
	t.Helper()
	for _, m := range ms {
		if m.GetInvertMatch() || m.GetTreatMissingHeaderAsEmpty() {
			t.Fatalf("header matcher %s: the emulator does not model invert_match or treat_missing_header_as_empty", m.GetName())
		}
		v, present := r.header(m.GetName())
		switch s := m.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			if present != s.PresentMatch {
				return false
			}
		case *routev3.HeaderMatcher_StringMatch:
			if !present || !stringMatches(t, s.StringMatch, v) {
				return false
			}
		default:
			t.Fatalf("header matcher %s: the emulator does not model %T", m.GetName(), s)
		}
	}
	return true
}

func stringMatches(t *testing.T, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex: // RE2, matching the whole value
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

// reply is what Envoy answers once the rate limit service has spoken (or
// failed to).
type reply struct {
	upstream bool              // the request went on to the app
	status   int               // HTTP status of Envoy's local reply; 0 when upstream
	headers  map[string]string // headers of the local reply
}

// reply mirrors the filter: OVER_LIMIT becomes a local reply, 429 (or
// rate_limited_status), carrying the answer's response_headers_to_add; for a
// gRPC request HTTP 200 with grpc-status RESOURCE_EXHAUSTED (8) or
// UNAVAILABLE (14). A failed call lets the request through unless
// failure_mode_deny.
func (e *edge) reply(r request, resp *rlsv3.RateLimitResponse, err error) reply {
	f := e.filter
	if err != nil {
		if f.GetFailureModeDeny() {
			return reply{status: cmpOrInt(int(f.GetStatusOnError().GetCode()), 500)}
		}
		return reply{upstream: true}
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		return reply{upstream: true}
	}
	h := map[string]string{}
	for _, hv := range resp.GetResponseHeadersToAdd() {
		h[strings.ToLower(hv.GetKey())] = hv.GetValue()
	}
	if !f.GetDisableXEnvoyRatelimitedHeader() {
		h["x-envoy-ratelimited"] = "true"
	}
	if r.grpc() {
		h["grpc-status"] = "14"
		if f.GetRateLimitedAsResourceExhausted() {
			h["grpc-status"] = "8"
		}
		return reply{status: 200, headers: h}
	}
	status := 429
	if c := int(f.GetRateLimitedStatus().GetCode()); c >= 400 {
		status = c
	}
	return reply{status: status, headers: h}
}

func cmpOrInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func descString(d *rlcommon.RateLimitDescriptor) string {
	var parts []string
	for _, e := range d.GetEntries() {
		parts = append(parts, e.GetKey()+"="+e.GetValue())
	}
	return strings.Join(parts, "|")
}

func descStrings(ds []*rlcommon.RateLimitDescriptor) []string {
	var s []string
	for _, d := range ds {
		s = append(s, descString(d))
	}
	return s
}
