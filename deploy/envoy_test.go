package deploy

import (
	"context"
	"errors"
	"fmt"
	"log"
	"math"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	h2mv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_to_metadata/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	// Every type a typed_config of envoy.yaml (or of the docs' snippets) names
	// must be registered for protojson to resolve its "@type".
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
	"github.com/slidingwindow/ratelimit/internal/service"
)

// ---------------------------------------------------------------------------
// Parsing and validating with Envoy's protos.

// unmarshalEnvoy reads Envoy YAML into m as Envoy does: YAML to JSON, then
// the proto JSON mapping, unknown fields refused.
func unmarshalEnvoy(data []byte, m proto.Message) error {
	j, err := yaml.YAMLToJSONStrict(data) // duplicate keys are an error
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(j, m)
}

// schemaCheck collects what validating a message tree finds.
type schemaCheck struct {
	types []string // type URLs of every Any unpacked, in walk order
	errs  []error
}

// validate runs protoc-gen-validate's ValidateAll on m, then walks it: every
// google.protobuf.Any (typed_config, typed_extension_protocol_options, ...)
// is unpacked with the registered types and validated in turn, which the
// outer ValidateAll does not do. Fields and enum values marked deprecated are
// reported too: Envoy warns about them, and refuses some by default.
func (c *schemaCheck) validate(m proto.Message, path string) {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			c.errs = append(c.errs, fmt.Errorf("%s (%s): %w", path, m.ProtoReflect().Descriptor().FullName(), err))
		}
	} else {
		c.errs = append(c.errs, fmt.Errorf("%s: %s has no ValidateAll", path, m.ProtoReflect().Descriptor().FullName()))
	}
	c.walk(m.ProtoReflect(), path)
}

func (c *schemaCheck) walk(m protoreflect.Message, path string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		if opts, ok := fd.Options().(*descriptorpb.FieldOptions); ok && opts.GetDeprecated() {
			c.errs = append(c.errs, fmt.Errorf("%s: deprecated field", p))
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				c.value(fd, l.Get(i), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				c.value(fd.MapValue(), mv, fmt.Sprintf("%s[%v]", p, k))
				return true
			})
		default:
			c.value(fd, v, p)
		}
		return true
	})
}

func (c *schemaCheck) value(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ev := fd.Enum().Values().ByNumber(v.Enum())
		if ev == nil {
			c.errs = append(c.errs, fmt.Errorf("%s: unknown enum number %d", path, v.Enum()))
		} else if opts, ok := ev.Options().(*descriptorpb.EnumValueOptions); ok && opts.GetDeprecated() {
			c.errs = append(c.errs, fmt.Errorf("%s: deprecated enum value %s", path, ev.Name()))
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		msg := v.Message()
		a, ok := msg.Interface().(*anypb.Any)
		if !ok {
			c.walk(msg, path)
			return
		}
		inner, err := a.UnmarshalNew() // resolved in protoregistry.GlobalTypes
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("%s: %s: %w (blank-import its package)", path, a.GetTypeUrl(), err))
			return
		}
		c.types = append(c.types, a.GetTypeUrl())
		c.validate(inner, path+"<"+string(inner.ProtoReflect().Descriptor().FullName())+">")
	}
}

// loadBootstrap parses and fully validates envoy.yaml.
func loadBootstrap(t *testing.T) (*bootstrapv3.Bootstrap, *schemaCheck) {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := unmarshalEnvoy(readFile(t, envoyFile), b); err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	c := &schemaCheck{}
	c.validate(b, "bootstrap")
	for _, err := range c.errs {
		t.Errorf("%s: %v", envoyFile, err)
	}
	if len(c.errs) > 0 {
		t.FailNow()
	}
	return b, c
}

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
		out := emulated{route: rt.GetName(), matched: rt, req: r}
		if len(rt.GetTypedPerFilterConfig()) > 0 {
			t.Fatalf("route %s: the emulator does not model typed_per_filter_config", rt.GetName())
		}
		out.descriptors = e.descriptors(t, rt, r, false, nil)
		return out
	}
	return emulated{}
}

// descriptors runs the route's rate_limits of the filter's stage and of one
// phase, as Envoy's populateRateLimitDescriptors does: before routing
// (streamDone false) or when the stream is done, with the dynamic metadata
// the stream gathered (namespace, then key).
func (e *edge) descriptors(t *testing.T, rt *routev3.Route, r request, streamDone bool, metadata map[string]map[string]string) []*rlcommon.RateLimitDescriptor {
	t.Helper()
	var ds []*rlcommon.RateLimitDescriptor
	for i, rl := range rt.GetRoute().GetRateLimits() {
		if rl.GetStage().GetValue() != e.filter.GetStage() || rl.GetApplyOnStreamDone() != streamDone {
			continue
		}
		if rl.GetLimit() != nil || rl.GetDisableKey() != "" {
			t.Fatalf("route %s rate_limits[%d]: the emulator does not model limit or disable_key", rt.GetName(), i)
		}
		d := descriptor(t, rl.GetActions(), r)
		if d == nil {
			continue
		}
		if ha := rl.GetHitsAddend(); ha != nil {
			cost, ok := hitsAddend(t, ha, metadata)
			if !ok { // Envoy logs "Invalid hits_addend" and drops the descriptor
				continue
			}
			d.HitsAddend = wrapperspb.UInt64(cost)
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
func (e *edge) streamDone(t *testing.T, out emulated, response map[string]string) []*rlcommon.RateLimitDescriptor {
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
	return e.descriptors(t, out.matched, out.req, true, metadata)
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
	x.svc = service.New(cfg, l, nil)
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
	ds := x.edge.streamDone(t, out.emulated, response)
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

func TestEnvoyBootstrapSchema(t *testing.T) {
	b, check := loadBootstrap(t)

	// Every typed_config was unpacked and validated.
	want := []string{
		"type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
		"type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
		"type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
		"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
		"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
	}
	got := slices.Compact(slices.Sorted(slices.Values(check.types)))
	if !slices.Equal(got, want) {
		t.Errorf("typed_config types:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	// The validation reaches inside typed_config: a bad value there fails.
	broken := strings.Replace(string(readFile(t, envoyFile)), "cluster_name: ratelimit", `cluster_name: ""`, 1)
	bb := &bootstrapv3.Bootstrap{}
	if err := unmarshalEnvoy([]byte(broken), bb); err != nil {
		t.Fatal(err)
	}
	if bb.ValidateAll() != nil {
		t.Error("the outer ValidateAll reached into a typed_config: the Any walk is no longer needed")
	}
	bc := &schemaCheck{}
	bc.validate(bb, "bootstrap")
	if len(bc.errs) == 0 || !strings.Contains(errors.Join(bc.errs...).Error(), "ClusterName") {
		t.Errorf("an empty envoy_grpc.cluster_name inside the filter's typed_config passed validation: %v", bc.errs)
	}
	// And an unknown field is refused, as Envoy refuses it.
	if err := unmarshalEnvoy([]byte(strings.Replace(string(readFile(t, envoyFile)), "domain: edge", "domain: edge\n                      domian: edge", 1)), &bootstrapv3.Bootstrap{}); err == nil {
		t.Error("an unknown field inside a typed_config was accepted")
	}

	e := newEdge(t, b)
	cfg := loadRules(t)
	f := e.filter

	t.Run("filter", func(t *testing.T) {
		if !cfg.HasDomain(f.GetDomain()) {
			t.Errorf("filter domain %q is not a domain of %s", f.GetDomain(), rulesDir)
		}
		for _, r := range cfg.Rules() {
			if r.Domain != f.GetDomain() {
				t.Errorf("rule %s: domain %q is not the filter's %q: nothing sends to it", r, r.Domain, f.GetDomain())
			}
		}
		// The service takes its deadline from Envoy's (grpc-timeout) and
		// answers by the rule's failure_mode before it, which needs a Redis
		// round trip and the answer's margin; past 100 ms a slow Redis would
		// hold every request that long.
		if timeout := f.GetTimeout().AsDuration(); timeout < 10*time.Millisecond || timeout > 100*time.Millisecond {
			t.Errorf("timeout %v: want between 10ms and 100ms", timeout)
		}
		if f.GetFailureModeDeny() {
			t.Error("failure_mode_deny: true; the documented choice is to fail open when the service is unreachable")
		}
		if f.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
			t.Errorf("enable_x_ratelimit_headers = %v", f.GetEnableXRatelimitHeaders())
		}
		if !f.GetRateLimitedAsResourceExhausted() {
			t.Error("rate_limited_as_resource_exhausted is off")
		}
		rls := f.GetRateLimitService()
		if rls.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("transport_api_version = %v", rls.GetTransportApiVersion())
		}
		name := rls.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		c := e.clusters[name]
		if c == nil {
			t.Fatalf("rate_limit_service cluster %q is not defined", name)
		}
		opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if opts == nil {
			t.Fatalf("cluster %s: no HttpProtocolOptions: gRPC needs HTTP/2", name)
		}
		hpo := unpack(t, opts, &upstreamhttpv3.HttpProtocolOptions{})
		if hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s: not explicit HTTP/2", name)
		}
	})

	t.Run("filter chain", func(t *testing.T) {
		names := e.filterNames
		if len(names) < 2 || names[len(names)-1] != "envoy.filters.http.router" {
			t.Errorf("http_filters %v: the router must be last", names)
		}
		if i := slices.Index(names, "envoy.filters.http.ratelimit"); i < 0 || i > len(names)-2 {
			t.Errorf("http_filters %v: envoy.filters.http.ratelimit must come before the router", names)
		}
	})

	t.Run("routes and clusters", func(t *testing.T) {
		for _, rt := range e.vhost.GetRoutes() {
			if rt.GetName() == "" {
				t.Error("a route has no name")
			}
			if c := rt.GetRoute().GetCluster(); e.clusters[c] == nil {
				t.Errorf("route %s: cluster %q is not defined", rt.GetName(), c)
			}
		}
		// The last route catches everything, so nothing escapes the
		// per-address limit by matching no route.
		routes := e.vhost.GetRoutes()
		if m := routes[len(routes)-1].GetMatch(); m.GetPrefix() != "/" {
			t.Errorf("last route matches %v, want prefix /", m)
		}
		if a := e.admin; a.GetAddress() != "127.0.0.1" {
			t.Errorf("admin listens on %q: keep it on loopback", a.GetAddress())
		}
	})
}

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
	// nesting or keys drifted from the actions fails here.
	for _, r := range cfg.Rules() {
		if !hit[r.String()] {
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

// TestBudgetsDocTokenBudget: docs/budgets.md's two-phase snippets are Envoy
// config, and are the /llm route's and the header_to_metadata filter of
// envoy.yaml.
func TestBudgetsDocTokenBudget(t *testing.T) {
	const doc = "../docs/budgets.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	action := &routev3.RouteAction{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the route's action: rate_limits")), action); err != nil {
		t.Fatalf("%s: rate_limits: %v", doc, err)
	}
	llm := e.vhost.GetRoutes()[slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "llm" })]
	want := llm.GetRoute().GetRateLimits()
	got := action.GetRateLimits()
	if len(got) != 2 || len(want) < 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("%s: rate_limits %v, want the first two of %s's llm route: %v", doc, got, envoyFile, want)
	}
	filter := &hcmv3.HttpFilter{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# an http_filters entry, before envoy.filters.http.ratelimit")), filter); err != nil {
		t.Fatalf("%s: http filter: %v", doc, err)
	}
	check := &schemaCheck{}
	check.validate(filter, "http_filters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	i := slices.IndexFunc(e.hcm.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool { return f.GetName() == filter.GetName() })
	if i < 0 || !proto.Equal(e.hcm.GetHttpFilters()[i], filter) {
		t.Errorf("%s: the header_to_metadata filter differs from %s's", doc, envoyFile)
	}
	if r := slices.Index(e.filterNames, "envoy.filters.http.ratelimit"); i < 0 || i > r {
		t.Errorf("%s: header_to_metadata must come before the rate limit filter: %v", envoyFile, e.filterNames)
	}
}

// TestReadmeEnvoySnippet: the README's Envoy blocks are envoy.yaml's rate
// limit filter, the service's cluster and the default route's rate_limits,
// field for field, so the front page shows what deploy_test.go checks.
func TestReadmeEnvoySnippet(t *testing.T) {
	const doc = "../README.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)

	filter := &hcmv3.HttpFilter{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the rate limit filter: an http_filters entry, before envoy.filters.http.router")), filter); err != nil {
		t.Fatalf("%s: rate limit filter: %v", doc, err)
	}
	check := &schemaCheck{}
	check.validate(filter, "http_filters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	i := slices.IndexFunc(e.hcm.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool { return f.GetName() == "envoy.filters.http.ratelimit" })
	if i < 0 || !proto.Equal(e.hcm.GetHttpFilters()[i], filter) {
		t.Errorf("%s: the rate limit filter differs from %s's", doc, envoyFile)
	}

	cluster := &clusterv3.Cluster{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the service's cluster: gRPC, so HTTP/2")), cluster); err != nil {
		t.Fatalf("%s: cluster: %v", doc, err)
	}
	check = &schemaCheck{}
	check.validate(cluster, "clusters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	name := e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if want := e.clusters[name]; want == nil || !proto.Equal(cluster, want) {
		t.Errorf("%s: cluster %v differs from %s's %q cluster", doc, cluster, envoyFile, name)
	}

	action := &routev3.RouteAction{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# a route's action: one descriptor per client address, [remote_address=<client ip>]")), action); err != nil {
		t.Fatalf("%s: rate_limits: %v", doc, err)
	}
	j := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "default" })
	if j < 0 {
		t.Fatalf("%s has no default route", envoyFile)
	}
	want := e.vhost.GetRoutes()[j].GetRoute().GetRateLimits()
	if got := action.GetRateLimits(); len(want) == 0 || !slices.EqualFunc(got, want, func(a, b *routev3.RateLimit) bool { return proto.Equal(a, b) }) {
		t.Errorf("%s: rate_limits %v, want %s's default route's: %v", doc, got, envoyFile, want)
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
func docsCentralCluster(t *testing.T) *clusterv3.Cluster {
	t.Helper()
	c := &clusterv3.Cluster{}
	if err := unmarshalEnvoy([]byte(docsBlock(t, "# envoy cluster: central")), c); err != nil {
		t.Fatalf("%s: central cluster: %v", deployDocFile, err)
	}
	return c
}

func TestDocsCentralCluster(t *testing.T) {
	c := docsCentralCluster(t)
	check := &schemaCheck{}
	check.validate(c, "cluster")
	for _, err := range check.errs {
		t.Errorf("%s: central cluster: %v", deployDocFile, err)
	}
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	sidecar := e.clusters[e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if c.GetName() != sidecar.GetName() {
		t.Errorf("central cluster is named %q, want %q as in %s", c.GetName(), sidecar.GetName(), envoyFile)
	}
	const hpo = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	if !proto.Equal(c.GetTypedExtensionProtocolOptions()[hpo], sidecar.GetTypedExtensionProtocolOptions()[hpo]) {
		t.Error("central cluster's HttpProtocolOptions differ from the sidecar's (HTTP/2)")
	}
	if c.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("central cluster type %v, want STRICT_DNS on the headless Service, one host per pod", c.GetType())
	}
	hc := c.GetHealthChecks()
	if len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != rlsv3.RateLimitService_ServiceDesc.ServiceName {
		t.Errorf("central cluster health_checks %v, want one gRPC health check of %s", hc, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
}

// docsBlock returns the fenced code block of docs/deploy.md whose first line
// is marker.
func docsBlock(t *testing.T, marker string) string {
	t.Helper()
	return fencedBlock(t, deployDocFile, marker)
}

// fencedBlock returns the fenced yaml code block of file whose first line is
// marker.
func fencedBlock(t *testing.T, file, marker string) string {
	t.Helper()
	var found []string
	var block []string // lines of the yaml block being read, its fence's indentation removed
	indent, in := "", false
	for _, line := range strings.Split(string(readFile(t, file)), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case !in && strings.HasPrefix(trimmed, "```"):
			in, block = true, nil
			indent = line[:len(line)-len(trimmed)]
			if strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) != "yaml" {
				block = nil
				indent = "\x00" // not yaml: skip to the closing fence
			}
		case in && strings.HasPrefix(trimmed, "```"):
			in = false
			if len(block) > 0 && block[0] == marker {
				found = append(found, strings.Join(block, "\n")+"\n")
			}
		case in && indent != "\x00":
			block = append(block, strings.TrimPrefix(line, indent))
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d yaml blocks start with %q, want 1", file, len(found), marker)
	}
	return found[0]
}
