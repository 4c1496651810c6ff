package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/ohler55/ojg/jp"
	"github.com/ohler55/ojg/oj"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"sigs.k8s.io/yaml"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// Envoy Gateway's EnvoyPatchPolicy, BackendTrafficPolicy rule and JSON patch
// processing, as read at envoyproxy/gateway@d32f282 (docs/budgets.md cites
// the lines). Only the fields the docs use are mirrored; unmarshalling is
// strict, so a misspelt field fails.

// envoyPatchPolicy mirrors api/v1alpha1/envoypatchpolicy_types.go.
type envoyPatchPolicy struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	Spec struct {
		Type      string `json:"type"`
		TargetRef struct {
			Group string `json:"group"`
			Kind  string `json:"kind"`
			Name  string `json:"name"`
		} `json:"targetRef"`
		JSONPatches []struct {
			Type      string             `json:"type"`
			Name      string             `json:"name"`
			Operation jsonPatchOperation `json:"operation"`
		} `json:"jsonPatches"`
	} `json:"spec"`
}

// jsonPatchOperation mirrors JSONPatchOperation of the same file.
type jsonPatchOperation struct {
	Op       string          `json:"op"`
	Path     *string         `json:"path,omitempty"`
	JSONPath *string         `json:"jsonPath,omitempty"`
	From     *string         `json:"from,omitempty"`
	Value    json.RawMessage `json:"value,omitempty"`
}

// rateLimitRule mirrors RateLimitRule of api/v1alpha1/ratelimit_types.go.
type rateLimitRule struct {
	ClientSelectors []struct {
		Headers []struct {
			Name  string  `json:"name"`
			Type  string  `json:"type"`
			Value *string `json:"value,omitempty"`
		} `json:"headers"`
	} `json:"clientSelectors"`
	Limit struct {
		Requests uint32 `json:"requests"`
		Unit     string `json:"unit"`
	} `json:"limit"`
	Cost struct {
		Request  rateLimitCost `json:"request"`
		Response rateLimitCost `json:"response"`
	} `json:"cost"`
}

type rateLimitCost struct {
	From     string  `json:"from"`
	Number   *uint64 `json:"number,omitempty"`
	Metadata *struct {
		Namespace string `json:"namespace"`
		Key       string `json:"key"`
	} `json:"metadata,omitempty"`
}

// hitsAddend is what Envoy Gateway renders for a cost
// (internal/gatewayapi/backendtrafficpolicy.go translateRateLimitCost, then
// internal/xds/translator/ratelimit.go rateLimitCostToHitsAddend).
func (c rateLimitCost) hitsAddend() *routev3.RateLimit_HitsAddend {
	ha := &routev3.RateLimit_HitsAddend{}
	if c.Number != nil {
		ha.Number = wrapperspb.UInt64(*c.Number)
	}
	if c.Metadata != nil {
		ha.Format = fmt.Sprintf("%%DYNAMIC_METADATA(%s:%s)%%", c.Metadata.Namespace, c.Metadata.Key)
	}
	return ha
}

// patchRouteConfig patches a RouteConfiguration as Envoy Gateway does
// (internal/xds/translator/jsonpatch.go processJSONPatches): protojson with
// the proto field names, the operation applied, protojson back.
func patchRouteConfig(rc *routev3.RouteConfiguration, op jsonPatchOperation) (*routev3.RouteConfiguration, error) {
	doc, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(rc)
	if err != nil {
		return nil, err
	}
	patched, err := applyJSONPatch(doc, op)
	if err != nil {
		return nil, err
	}
	out := &routev3.RouteConfiguration{}
	if err := protojson.Unmarshal(patched, out); err != nil {
		return nil, fmt.Errorf("unmarshalling the patched route configuration: %w", err)
	}
	return out, nil
}

// applyJSONPatch is Envoy Gateway's ApplyJSONPatches
// (internal/utils/jsonpatch/patch.go) on one operation: a jsonPath becomes
// the JSON pointers it locates, path appended; each is applied with
// evanphx/json-patch/v5, creating missing parents on add.
func applyJSONPatch(doc []byte, op jsonPatchOperation) ([]byte, error) {
	if op.Path == nil && op.JSONPath == nil {
		return nil, errors.New("a patch operation must specify a path or jsonPath")
	}
	pointers := []string{}
	if op.JSONPath != nil {
		path := ""
		if op.Path != nil {
			path = *op.Path
		}
		var err error
		if pointers, err = jsonPathPointers(doc, *op.JSONPath, path); err != nil {
			return nil, err
		}
		if len(pointers) == 0 {
			return nil, fmt.Errorf("no jsonPointers were found while evaluating the jsonPath: %q", *op.JSONPath)
		}
	} else {
		pointers = append(pointers, *op.Path)
	}
	opts := jsonpatch.NewApplyOptions()
	opts.EnsurePathExistsOnAdd = true
	for _, p := range pointers {
		operation := jsonpatch.Operation{}
		for k, v := range map[string]any{"op": op.Op, "path": p} {
			raw, err := json.Marshal(v)
			if err != nil {
				return nil, err
			}
			operation[k] = (*json.RawMessage)(&raw)
		}
		if op.Value != nil {
			v := slices.Clone(op.Value)
			operation["value"] = (*json.RawMessage)(&v)
		}
		var err error
		if doc, err = (jsonpatch.Patch{operation}).ApplyWithOptions(doc, opts); err != nil {
			return nil, fmt.Errorf("op=%s path=%s: %w", op.Op, p, err)
		}
	}
	return doc, nil
}

// jsonPathPointers is Envoy Gateway's ConvertPathToPointers
// (internal/utils/jsonpatch/jsonpathtopointer.go), with ohler55/ojg as there.
func jsonPathPointers(doc []byte, jsonPath, path string) ([]string, error) {
	obj, err := oj.Parse(doc)
	if err != nil {
		return nil, err
	}
	x, err := jp.ParseString(jsonPath)
	if err != nil {
		return nil, err
	}
	if _, root := x[0].(jp.Root); len(x) == 1 && root {
		return nil, errors.New("using only Root ('$') in json path expression is not allowed")
	}
	var pointers []string
	for _, loc := range x.Locate(obj, 0) {
		var b strings.Builder
		for _, f := range loc {
			switch f := f.(type) {
			case jp.Root:
			case jp.Nth:
				fmt.Fprintf(&b, "/%d", int(f))
			case jp.Child:
				b.WriteString("/" + jsonPointerEscape(string(f)))
			default:
				return nil, fmt.Errorf("no conversion of %T to a JSON pointer", f)
			}
		}
		p := b.String()
		if path != "" {
			p = strings.TrimSuffix(p, "/") + "/" + strings.TrimPrefix(path, "/")
		}
		pointers = append(pointers, p)
	}
	return pointers, nil
}

// jsonPointerEscape escapes a JSON pointer's reference token (RFC 6901).
func jsonPointerEscape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// envoyGatewayRouteConfigs reads a fixture of deploy/testdata/envoygateway:
// a YAML list of RouteConfigurations.
func envoyGatewayRouteConfigs(t *testing.T, file string) []*routev3.RouteConfiguration {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict(readFile(t, filepath.Join("testdata", "envoygateway", file)))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var docs []json.RawMessage
	if err := json.Unmarshal(j, &docs); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var rcs []*routev3.RouteConfiguration
	for i, d := range docs {
		rc := &routev3.RouteConfiguration{}
		if err := protojson.Unmarshal(d, rc); err != nil {
			t.Fatalf("%s[%d]: %v", file, i, err)
		}
		rcs = append(rcs, rc)
	}
	return rcs
}

// perRouteRateLimits finds the route named name and its RateLimitPerRoute
// under key.
func perRouteRateLimits(t *testing.T, rc *routev3.RouteConfiguration, name, key string) (*routev3.Route, *ratelimitv3.RateLimitPerRoute) {
	t.Helper()
	for _, vh := range rc.GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			if rt.GetName() != name {
				continue
			}
			a := rt.GetTypedPerFilterConfig()[key]
			if a == nil {
				t.Fatalf("route %s: no typed_per_filter_config %q: %v", name, key, rt.GetTypedPerFilterConfig())
			}
			return rt, unpack(t, a, &ratelimitv3.RateLimitPerRoute{})
		}
	}
	t.Fatalf("route configuration %s: no route %s", rc.GetName(), name)
	return nil, nil
}

// docRouteName is the route name an operation's jsonPath selects.
var docRouteName = regexp.MustCompile(`^\.\.routes\[\?\(@\.name=='([^']+)'\)\]$`)

const (
	budgetsDoc      = "../docs/budgets.md"
	rlFilterKey     = "envoy.filters.http.ratelimit" // Envoy Gateway's filter name for a listener's own domain
	docPolicyMarker = "# an EnvoyPatchPolicy: reserve the estimate, settle the lease"
	docRuleMarker   = "# the service's rule for the reservation, in --config"
	docBTPMarker    = "# a BackendTrafficPolicy's rateLimit.global.rules entry"
)

// TestBudgetsDocEnvoyGatewayReservation: docs/budgets.md's EnvoyPatchPolicy,
// applied as Envoy Gateway applies it to route configurations its translator
// renders for cost-based global rate limits, turns each route's two-phase
// entries into a reservation (the estimate on the request entry, the lease
// id's metadata action on the stream-done entry) and changes nothing else;
// the result passes Envoy's protos; and, emulated, it sends the service with
// the doc's rule an acquisition of the estimate and a settlement of the
// actual cost naming its lease, and nothing after a denial.
func TestBudgetsDocEnvoyGatewayReservation(t *testing.T) {
	var policy envoyPatchPolicy
	if err := yaml.UnmarshalStrict([]byte(fencedBlock(t, budgetsDoc, docPolicyMarker)), &policy); err != nil {
		t.Fatalf("%s: the EnvoyPatchPolicy: %v", budgetsDoc, err)
	}
	ruleText := fencedBlock(t, budgetsDoc, docRuleMarker)
	docCfg, err := config.Parse("budgets.md", []byte(ruleText), config.Defaults{})
	if err != nil {
		t.Fatalf("%s: the rule: %v", budgetsDoc, err)
	}
	rule := docCfg.Rules()[0]
	if !rule.Leases || len(docCfg.Rules()) != 1 {
		t.Fatalf("%s: rules %v, want one with leases", budgetsDoc, docCfg.Rules())
	}

	// The policy: two operations on the RouteConfiguration named after the
	// listener, which is the rule's domain, selecting by name the route whose
	// generic_key is the rule's key.
	sp := policy.Spec
	if policy.APIVersion != "gateway.envoyproxy.io/v1alpha1" || policy.Kind != "EnvoyPatchPolicy" || sp.Type != "JSONPatch" ||
		sp.TargetRef.Kind != "Gateway" || len(sp.JSONPatches) != 2 {
		t.Fatalf("%s: %+v, want an EnvoyPatchPolicy of two JSONPatch operations on a Gateway", budgetsDoc, policy)
	}
	var docRoute string
	for i, p := range sp.JSONPatches {
		if p.Type != "type.googleapis.com/envoy.config.route.v3.RouteConfiguration" || p.Name != rule.Domain {
			t.Errorf("%s: patch %d on %s %q, want the RouteConfiguration named as the rule's domain %q", budgetsDoc, i, p.Type, p.Name, rule.Domain)
		}
		m := docRouteName.FindStringSubmatch(derefOr(p.Operation.JSONPath))
		if m == nil || (docRoute != "" && m[1] != docRoute) {
			t.Fatalf("%s: patch %d's jsonPath %q selects no route by name, or another route", budgetsDoc, i, derefOr(p.Operation.JSONPath))
		}
		docRoute = m[1]
	}
	if lv := rule.Levels[0]; lv.Key != docRoute || lv.Value != docRoute {
		t.Errorf("%s: the rule's descriptor %s=%s, want the patched route's generic_key %s=%s", budgetsDoc, lv.Key, lv.Value, docRoute, docRoute)
	}
	reserve, settle := sp.JSONPatches[0].Operation, sp.JSONPatches[1].Operation
	estimate := &routev3.RateLimit_HitsAddend{}
	if err := protojson.Unmarshal(reserve.Value, estimate); err != nil || estimate.GetNumber() == nil || estimate.GetFormat() != "" {
		t.Fatalf("%s: the reservation's value %s: %v, want a hits_addend number", budgetsDoc, reserve.Value, err)
	}
	leaseAction := &routev3.RateLimit_Action{}
	if err := protojson.Unmarshal(settle.Value, leaseAction); err != nil {
		t.Fatalf("%s: the settlement's value: %v", budgetsDoc, err)
	}
	md := leaseAction.GetMetadata()
	if path := md.GetMetadataKey().GetPath(); md.GetDescriptorKey() != "lease" || md.GetSource() != routev3.RateLimit_Action_MetaData_DYNAMIC ||
		md.GetMetadataKey().GetKey() != rlFilterNamespace || len(path) != 2 || path[0].GetKey() != "leases" || path[1].GetKey() != rule.Name {
		t.Errorf("%s: the settlement's action %v, want lease from %s leases.%s (DYNAMIC)", budgetsDoc, leaseAction, rlFilterNamespace, rule.Name)
	}

	// The BackendTrafficPolicy rule: its limit is the service's rule's, a
	// Distinct header (one descriptor value per tenant, as the rule's
	// valueless key takes), nothing consumed at the request, the tokens from
	// Envoy AI Gateway's namespace at stream end.
	var btps []rateLimitRule
	if err := yaml.UnmarshalStrict([]byte(fencedBlock(t, budgetsDoc, docBTPMarker)), &btps); err != nil || len(btps) != 1 {
		t.Fatalf("%s: the BackendTrafficPolicy rule: %v, want one", budgetsDoc, err)
	}
	btp := btps[0]
	unit, err := config.ParseUnit(strings.ToLower(btp.Limit.Unit))
	if err != nil || btp.Limit.Requests != rule.RequestsPerUnit || unit != rule.Unit || rule.UnitMultiplier != 1 {
		t.Errorf("%s: the policy's limit %+v (%v), want the rule's %d per %v", budgetsDoc, btp.Limit, err, rule.RequestsPerUnit, rule.Unit)
	}
	if len(btp.ClientSelectors) != 1 || len(btp.ClientSelectors[0].Headers) != 1 || btp.ClientSelectors[0].Headers[0].Type != "Distinct" ||
		len(rule.Levels) != 2 || rule.Levels[1].Key != "rule-0-match-0" || rule.Levels[1].Value != "" {
		t.Errorf("%s: the policy's selectors %+v and the rule's levels %v, want one Distinct header, rule-0-match-0 of any value", budgetsDoc, btp.ClientSelectors, rule.Levels)
	}
	if got := btp.Cost.Response.hitsAddend().GetFormat(); btp.Cost.Request.From != "Number" || btp.Cost.Request.Number == nil ||
		got != "%DYNAMIC_METADATA(io.envoy.ai_gateway:llm_total_token)%" {
		t.Errorf("%s: the policy's cost %+v renders %q at stream end, want a request Number and Envoy AI Gateway's llm_total_token", budgetsDoc, btp.Cost, got)
	}

	for _, tt := range []struct {
		file, route string
		filterKey   string            // the RateLimitPerRoute's key in typed_per_filter_config
		headers     map[string]string // a request the route's actions make a descriptor of
		emulate     string            // why the emulation is skipped; "" runs it
	}{
		{file: "ratelimit.routes.yaml", route: "res-cost", filterKey: rlFilterKey,
			headers: map[string]string{"x-org-id": "tenant-a"}}, // cost.response only: the request entry has no hits_addend
		{file: "ratelimit.routes.yaml", route: "req-and-resp-cost", filterKey: rlFilterKey,
			headers: map[string]string{"x-user-id": "one"}, emulate: "its limit from metadata is not modelled"},
		{file: "ratelimit-global-shared.routes.yaml", route: "third-route", filterKey: rlFilterKey + "/test-namespace/test-policy-2",
			headers: map[string]string{"x-user-id": "two"}}, // shared: true, cost.request 0
	} {
		t.Run(tt.file+"/"+tt.route, func(t *testing.T) {
			var rc *routev3.RouteConfiguration
			for _, c := range envoyGatewayRouteConfigs(t, tt.file) {
				if slices.ContainsFunc(c.GetVirtualHosts(), func(vh *routev3.VirtualHost) bool {
					return slices.ContainsFunc(vh.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == tt.route })
				}) {
					rc = c
				}
			}
			if rc == nil {
				t.Fatalf("%s has no route %s", tt.file, tt.route)
			}
			_, before := perRouteRateLimits(t, rc, tt.route, tt.filterKey)
			orig := before.GetRateLimits()
			if len(orig) != 2 || orig[0].GetApplyOnStreamDone() || !orig[1].GetApplyOnStreamDone() ||
				!proto.Equal(&routev3.RateLimit{Actions: orig[0].GetActions()}, &routev3.RateLimit{Actions: orig[1].GetActions()}) {
				t.Fatalf("%s rate_limits %v: want the request entry at 0, the stream-done entry at 1, with the same actions", tt.route, orig)
			}
			// The rule's top descriptor is the entry's generic_key: the
			// route's name, or a shared rule's name.
			key := orig[0].GetActions()[0].GetGenericKey()
			if key == nil || key.GetDescriptorKey() != key.GetDescriptorValue() ||
				(tt.filterKey == rlFilterKey && (key.GetDescriptorKey() != tt.route || before.GetDomain() != rc.GetName())) {
				t.Fatalf("%s: first action %v, domain %q: want generic_key of the route's name, the domain the route configuration's name %q",
					tt.route, orig[0].GetActions()[0], before.GetDomain(), rc.GetName())
			}

			// The doc's operations, aimed at this route and filter key.
			patched := rc
			for _, p := range sp.JSONPatches {
				op := p.Operation
				jsonPath := strings.Replace(*op.JSONPath, docRoute, tt.route, 1)
				path := strings.Replace(*op.Path, rlFilterKey+"/", jsonPointerEscape(tt.filterKey)+"/", 1)
				op.JSONPath, op.Path = &jsonPath, &path
				if patched, err = patchRouteConfig(patched, op); err != nil {
					t.Fatalf("%s: %v", jsonPath, err)
				}
			}
			check := &schemaCheck{}
			check.validate(patched, "route_config")
			for _, err := range check.errs {
				t.Errorf("patched: %v", err)
			}

			rt, after := perRouteRateLimits(t, patched, tt.route, tt.filterKey)
			got := after.GetRateLimits()
			wantReserve := proto.Clone(orig[0]).(*routev3.RateLimit)
			wantReserve.HitsAddend = estimate
			wantSettle := proto.Clone(orig[1]).(*routev3.RateLimit)
			wantSettle.Actions = append(wantSettle.Actions, leaseAction)
			if len(got) != 2 || !proto.Equal(got[0], wantReserve) || !proto.Equal(got[1], wantSettle) {
				t.Fatalf("patched rate_limits:\n  %v\nwant:\n  %v\n  %v", got, wantReserve, wantSettle)
			}
			if after.GetVhRateLimits() != ratelimitv3.RateLimitPerRoute_OVERRIDE || after.GetOverrideOption() != ratelimitv3.RateLimitPerRoute_DEFAULT {
				t.Fatalf("RateLimitPerRoute %v: the emulation reads its rate_limits alone", after)
			}
			// Nothing else changed: with the two entries put back, the
			// route configuration is the one Envoy Gateway rendered.
			after.RateLimits = orig
			a, err := anypb.New(after)
			if err != nil {
				t.Fatal(err)
			}
			rt.TypedPerFilterConfig[tt.filterKey] = a
			if !proto.Equal(patched, rc) {
				t.Errorf("the patch changed more than the two entries:\n%v\nwant:\n%v", patched, rc)
			}
			if tt.emulate != "" {
				t.Logf("emulation skipped: %s", tt.emulate)
				return
			}
			emulateReservation(t, got, before.GetDomain(), key.GetDescriptorKey(), rule, ruleText, tt.route, tt.headers)
		})
	}

	// A route the jsonPath does not find fails the patch (Envoy Gateway
	// reports it in the policy's status), rather than changing nothing.
	rc := envoyGatewayRouteConfigs(t, "ratelimit.routes.yaml")[0]
	op := reserve
	missing := strings.Replace(*op.JSONPath, docRoute, "no-such-route", 1)
	op.JSONPath = &missing
	if _, err := patchRouteConfig(rc, op); err == nil || !strings.Contains(err.Error(), "no jsonPointers") {
		t.Errorf("a jsonPath of no route: %v, want no jsonPointers found", err)
	}
}

func derefOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// emulateReservation drives the patched entries as Envoy would, against the
// service loaded with the doc's rule renamed for the fixture's domain and
// route: an acquisition reserves the estimate and is answered with a lease
// id; the stream-done descriptor names the lease and carries the actual cost
// from the metadata the entry's format reads, which the budget then holds in
// place of the estimate; a stream that ends without that metadata sends no
// settlement; a denial carries no lease id, so no settlement either.
func emulateReservation(t *testing.T, rls []*routev3.RateLimit, domain, descriptorKey string, doc *config.Rule, ruleText, route string, headers map[string]string) {
	t.Helper()
	docRoute := doc.Levels[0].Key
	renamed := strings.ReplaceAll(ruleText, docRoute, descriptorKey)
	renamed = strings.Replace(renamed, "domain: "+doc.Domain+"\n", "domain: "+domain+"\n", 1)
	cfg, err := config.Parse("budgets.md", []byte(renamed), config.Defaults{})
	if err != nil {
		t.Fatalf("the doc's rule renamed for %s: %v", route, err)
	}
	rule := cfg.Rules()[0]
	x := newRig(t, nil, cfg)
	req := request{method: "POST", path: "/", headers: headers, client: "192.0.2.1"}
	estimate := rls[0].GetHitsAddend().GetNumber().GetValue()
	m := dynamicMetadata.FindStringSubmatch(rls[1].GetHitsAddend().GetFormat())
	if m == nil {
		t.Fatalf("stream-done hits_addend %v: want a %%DYNAMIC_METADATA(ns:key)%% format", rls[1].GetHitsAddend())
	}
	const actual = 300
	used := map[string]map[string]string{m[1]: {m[2]: fmt.Sprint(actual)}}

	call := func(ds []*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		defer x.set(x.now.Add(time.Millisecond))
		resp, err := x.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
		if err != nil {
			t.Fatalf("ShouldRateLimit %v: %v", descStrings(ds), err)
		}
		return resp
	}
	acquire := func() ([]*rlcommon.RateLimitDescriptor, *rlsv3.RateLimitResponse) {
		t.Helper()
		ds := phaseDescriptors(t, route, rls, 0, req, false, nil, nil)
		if len(ds) != 1 || ds[0].GetHitsAddend().GetValue() != estimate || config.Match(cfg, domain, ds[0].GetEntries()) != rule {
			t.Fatalf("acquisition descriptors %v, want one of hits_addend %d matching the rule", descStrings(ds), estimate)
		}
		return ds, call(ds)
	}

	// Admitted: the estimate reserved, the lease id in the answer, the
	// settlement named by it and charged the actual cost.
	ds, resp := acquire()
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first acquisition %s: %v, want OK", descStrings(ds), resp)
	}
	settlement := phaseDescriptors(t, route, rls, 0, req, true, used, resp.GetDynamicMetadata())
	id := resp.GetDynamicMetadata().GetFields()["leases"].GetStructValue().GetFields()[rule.Name].GetStringValue()
	if want := descString(ds[0]) + "|lease=" + id; id == "" || len(settlement) != 1 || descString(settlement[0]) != want ||
		settlement[0].GetHitsAddend().GetValue() != actual || settlement[0].GetIsNegativeHits() {
		t.Fatalf("settlement descriptors %v (answer %v), want %s with hits_addend %d", descStrings(settlement), resp.GetDynamicMetadata(), want, actual)
	}
	call(settlement)
	t.Logf("acquisition %s hits_addend %d, settlement %s hits_addend %d", descString(ds[0]), estimate, descString(settlement[0]), actual)

	// The budget holds the actual cost, not the estimate: the next
	// reservation leaves the limit less both.
	_, resp = acquire()
	if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint64(rule.RequestsPerUnit)-actual-estimate; resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || uint64(got) != want {
		t.Fatalf("after a settlement of %d: %v, want OK with %d remaining", actual, resp, want)
	}
	// That stream ends without the tokens (the upstream failed): the format
	// gives no number, so Envoy sends no settlement.
	if ds := phaseDescriptors(t, route, rls, 0, req, true, nil, resp.GetDynamicMetadata()); len(ds) != 0 {
		t.Fatalf("stream done without the metadata: %v, want no descriptor", descStrings(ds))
	}

	// Reservations until one is denied: its answer names no lease, and its
	// stream-done descriptor is dropped.
	for i := 0; ; i++ {
		if i > int(rule.RequestsPerUnit/uint32(estimate)) {
			t.Fatal("no reservation was denied")
		}
		if _, resp = acquire(); resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			break
		}
	}
	if ds := phaseDescriptors(t, route, rls, 0, req, true, used, resp.GetDynamicMetadata()); len(ds) != 0 {
		t.Fatalf("stream done after a denial (answer metadata %v): %v, want no descriptor", resp.GetDynamicMetadata(), descStrings(ds))
	}
}
