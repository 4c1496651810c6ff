package deploy

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/slidingwindow/ratelimit/internal/settings"
)

// ---------------------------------------------------------------------------
// The Helm chart: rendered and linted by helm's own packages (the version
// go.mod pins), for each values file of its ci/ directory, decoded strictly
// as the kustomizations are, and held to the same checks (problems).

const (
	chartDir     = "helm/ratelimit"
	helmRelease  = "ratelimit"
	chartCIGlob  = chartDir + "/ci/*.yaml"
	envoyChartCM = "ratelimit-envoy"
	// minKubeVersion is the chart's kubeVersion floor (native sidecars, gRPC
	// probes, preStop sleep), which the chart is rendered and linted for;
	// helm's packages default to 1.20.
	minKubeVersion = "v1.30.0"
)

// helmValues reads a values file and --set overrides as `helm template -f
// FILE --set ...` does.
func helmValues(valuesFile string, set ...string) (chartutil.Values, error) {
	vals, err := chartutil.ReadValuesFile(valuesFile)
	if err != nil {
		return nil, err
	}
	for _, s := range set {
		if err := strvals.ParseInto(s, vals); err != nil {
			return nil, fmt.Errorf("--set %s: %w", s, err)
		}
	}
	return vals, nil
}

// helmRender renders the chart as `helm template` does: values.schema.json
// checked, the chart's kubeVersion against minKubeVersion, partials and
// NOTES.txt left out, the manifests in helm's install order.
func helmRender(valuesFile string, set ...string) ([]byte, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	vals, err := helmValues(valuesFile, set...)
	if err != nil {
		return nil, err
	}
	kube, err := chartutil.ParseKubeVersion(minKubeVersion)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kube
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kube.String()) {
		return nil, fmt.Errorf("the chart requires kubeVersion %s, not %s", ch.Metadata.KubeVersion, kube)
	}
	opts := chartutil.ReleaseOptions{Name: helmRelease, Namespace: "default", Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValues(ch, vals, opts, caps)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(ch, top)
	if err != nil {
		return nil, err
	}
	delete(files, path.Join(ch.Name(), "templates", "NOTES.txt"))
	_, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, m := range manifests {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return out.Bytes(), nil
}

// helmValuesFiles are the chart's ci/ values files: the test matrix.
func helmValuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(chartCIGlob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files %s (%v)", chartCIGlob, err)
	}
	return files
}

// helmTemplate renders the chart with a values file (and --set overrides)
// into a bundle, every document decoded strictly.
func helmTemplate(t *testing.T, valuesFile string, set ...string) *bundle {
	t.Helper()
	out, err := helmRender(valuesFile, set...)
	if err != nil {
		t.Fatalf("helm template -f %s --set %v: %v", valuesFile, set, err)
	}
	b := &bundle{dir: "helm template " + valuesFile}
	if b.objects, err = decodeManifest(b.dir, out); err != nil {
		t.Fatal(err)
	}
	b.requireUnique(t)
	return b
}

// TestHelmLint lints the chart as `helm lint --strict` does: no warning, no
// error, at its defaults and with each values file.
func TestHelmLint(t *testing.T) {
	kube, err := chartutil.ParseKubeVersion(minKubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, values := range append([]string{""}, helmValuesFiles(t)...) {
		vals := map[string]any{}
		if values != "" {
			if vals, err = helmValues(values); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range lint.AllWithKubeVersion(chartDir, vals, "default", kube).Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("helm lint --strict %s --values %q: %v", chartDir, values, m)
			}
		}
	}
}

// TestHelmChecks renders every values file and holds the output to the
// kustomize layouts' checks, plus what each file asks for.
func TestHelmChecks(t *testing.T) {
	covered := map[string]bool{}
	for _, values := range helmValuesFiles(t) {
		t.Run(filepath.Base(values), func(t *testing.T) {
			b := helmTemplate(t, values)
			requireNoProblems(t, b)

			var layout string
			var rl *corev1.Container
			for _, w := range b.workloads() {
				if c := w.container("ratelimit"); c != nil {
					rl = c
					layout = map[bool]string{true: "sidecar", false: "central"}[w.template.Spec.InitContainers != nil]
				}
			}
			if rl == nil {
				t.Fatal("no container ratelimit")
			}
			s, err := resolveSettings(rl)
			if err != nil {
				t.Fatal(err)
			}
			eps, err := s.redisEndpoints()
			if err != nil || len(eps) != 1 {
				t.Fatalf("Redis endpoints %v, %v", eps, err)
			}
			covered[layout+"-"+eps[0].mode] = true
			if s.XDS.ConfigType == "GRPC_XDS_SOTW" {
				covered["xds"] = true
				if b.object("v1/ConfigMap", "ratelimit-config") != nil {
					t.Error("config over xDS, yet the chart renders the rules ConfigMap")
				}
			}
			if s.Region != "" {
				covered["regions"] = true
				if ref := s.fromSecret["RATELIMIT_LEDGER_REDIS_URL"]; ref == nil || s.LedgerURL == "" || s.Regions < 1 {
					t.Errorf("region %s: the ledger's URL from %v (%q), %d regions: want it from its Secret, and a count", s.Region, ref, s.LedgerURL, s.Regions)
				}
			}
			if len(s.Reference.Values) > 0 {
				covered["reference"] = true
				for _, st := range settings.Table() {
					if _, passed := flags(rl.Args)[st.Name]; passed && len(st.Ref) > 0 {
						t.Errorf("with the reference's environment the service gets --%s, which %s sets there", st.Name, st.Ref[0].Name)
					}
				}
			}
			if b.object("apps/v1/StatefulSet", "ratelimit-redis") != nil != (eps[0].addrs[0] == "ratelimit-redis:6379") {
				t.Errorf("the bundled Redis is rendered, but the service dials %v", eps[0].addrs)
			}
			for _, sm := range objectsOf[*monitoringv1.ServiceMonitor](b) {
				covered["servicemonitor"] = true
				if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" {
					t.Errorf("ServiceMonitor %s endpoints %+v: want the HTTP port", sm.Name, sm.Spec.Endpoints)
				}
			}
			if layout == "sidecar" {
				helmSidecarChecks(t, b)
			}
		})
	}
	var want []string
	for _, layout := range []string{"central", "sidecar"} {
		for _, mode := range []string{"standalone", "sentinel", "cluster"} {
			want = append(want, layout+"-"+mode)
		}
	}
	want = append(want, "xds", "reference", "servicemonitor", "regions")
	for _, w := range want {
		if !covered[w] {
			t.Errorf("no values file in %s renders %s", chartCIGlob, w)
		}
	}
}

// helmSidecarChecks: Envoy's bootstrap is deploy/envoy.yaml byte for byte,
// and its checksum on the pods rolls them when it changes.
func helmSidecarChecks(t *testing.T, b *bundle) {
	t.Helper()
	cm, _ := b.configMap(envoyChartCM)
	if cm == nil {
		t.Fatalf("no ConfigMap %s", envoyChartCM)
	}
	envoyYAML := string(readFile(t, envoyFile))
	if len(cm.Data) != 1 || cm.Data["envoy.yaml"] != envoyYAML {
		t.Errorf("ConfigMap %s is not %s byte for byte: cp %s %s/files/envoy.yaml", cm.Name, envoyFile, envoyFile, chartDir)
	}
	sum := sha256.Sum256([]byte(cm.Data["envoy.yaml"]))
	for _, d := range objectsOf[*appsv1.Deployment](b) {
		if got := d.Spec.Template.Annotations["checksum/envoy-config"]; got != hex.EncodeToString(sum[:]) {
			t.Errorf("Deployment %s: checksum/envoy-config %q is not the bootstrap's sha256: a change would not restart Envoy", d.Name, got)
		}
	}
}

// TestHelmRenderRefuses: values that cannot work fail the rendering with a
// message saying what to set (values.schema.json, or the templates), rather
// than render pods that would count alone or not start.
func TestHelmRenderRefuses(t *testing.T) {
	values := filepath.Join(chartDir, "ci", "central-standalone.yaml")
	for _, tt := range []struct {
		set  []string
		want string
	}{
		{[]string{"redis.mode=sentinel"}, "redis.bundled runs a standalone Redis"},
		{[]string{"redis.mode=sentinel", "redis.bundled.enabled=false", "redis.addresses={s:26379}"}, "needs redis.masterName"},
		{[]string{"redis.bundled.enabled=false"}, "redis.addresses is empty"},
		{[]string{"redis.mode=replica"}, "at '/redis/mode': value must be one of"},
		{[]string{"redis.adresses={redis:6379}"}, "additional properties 'adresses' not allowed"},
		{[]string{"config.source=xds"}, "needs config.xds.serverURL"},
		{[]string{"layout=gateway"}, "at '/layout': value must be one of"},
		{[]string{"central.autoscaling.enabled=false", "central.replicas=1"}, "would block every drain"},
		{[]string{"layout=sidecar", "serviceMonitor.enabled=true"}, "central layout's Service"},
		{[]string{"regions.region=eu", "regions.count=3"}, "regions.region needs regions.ledger.existingSecret.name"},
		{[]string{"regions.region=eu", "regions.ledger.existingSecret.name=l"}, "regions.region needs regions.count"},
	} {
		if _, err := helmRender(values, tt.set...); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("--set %v: error %v, want one containing %q", tt.set, err, tt.want)
		}
	}
}

// TestHelmChecksCatchMistakes plants mistakes in the chart's output, in the
// parts that differ from the kustomize layouts (Secrets, Sentinel and
// Cluster URLs, xDS, the reference's environment, the ServiceMonitor) and in
// what they share, and expects the same checks to say so.
func TestHelmChecksCatchMistakes(t *testing.T) {
	ci := func(name string) string { return filepath.Join(chartDir, "ci", name+".yaml") }
	rl := func(b *bundle) *corev1.Container {
		for _, w := range b.workloads() {
			if c := w.container("ratelimit"); c != nil {
				return c
			}
		}
		t.Fatal("no container ratelimit")
		return nil
	}
	env := func(b *bundle, name string) *corev1.EnvVar {
		c := rl(b)
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
		if i < 0 {
			t.Fatalf("no env %s", name)
		}
		return &c.Env[i]
	}
	for _, tt := range []struct {
		name, values string
		mutate       func(b *bundle)
		problem      string
	}{
		{"optional secret", "central-sentinel", func(b *bundle) {
			env(b, "RATELIMIT_REDIS_SENTINEL_URL").ValueFrom.SecretKeyRef.Optional = ptr(true)
		}, "secretKeyRef is optional"},
		{"secret without key", "central-reference-sentinel", func(b *bundle) {
			env(b, "REDIS_AUTH").ValueFrom.SecretKeyRef.Key = ""
		}, "secretKeyRef needs a name and a key"},
		{"sentinel without master", "sidecar-sentinel", func(b *bundle) {
			e := env(b, "RATELIMIT_REDIS_SENTINEL_URL")
			e.Value = strings.Replace(e.Value, "master_name=mymaster", "master=mymaster", 1)
		}, "master"},
		{"no redis", "central-cluster", func(b *bundle) {
			c := rl(b)
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "RATELIMIT_REDIS_CLUSTER_URL" })
		}, "0 Redis URLs"},
		{"two redis", "central-standalone", func(b *bundle) {
			c := rl(b)
			c.Env = append(c.Env, corev1.EnvVar{Name: "RATELIMIT_REDIS_CLUSTER_URL", Value: "redis://ratelimit-redis:6379"})
		}, "2 Redis URLs"},
		{"bundled redis port", "sidecar-standalone", func(b *bundle) {
			env(b, "RATELIMIT_REDIS_URL").Value = "redis://ratelimit-redis:6380/0"
		}, "port 6380 is not a port of Service ratelimit-redis"},
		{"reference redis host", "central-reference-sentinel", func(b *bundle) {
			env(b, "REDIS_URL").Value = "mymaster,redis-sentinel:26379"
		}, "host redis-sentinel is not a Service of the build"},
		{"reference config dot files", "central-reference-sentinel", func(b *bundle) {
			env(b, "RUNTIME_IGNOREDOTFILES").Value = "false"
		}, "mounted"},
		{"reference config path", "central-reference-sentinel", func(b *bundle) {
			env(b, "RUNTIME_SUBDIRECTORY").Value = "rl"
		}, "nothing is mounted at --config=/data/rl/config"},
		{"reference port", "central-reference-sentinel", func(b *bundle) {
			env(b, "PORT").Value = "9090"
		}, "--http-addr port 9090 is not a container port"},
		{"reference debug port", "central-reference-sentinel", func(b *bundle) {
			c := rl(b)
			c.Ports = slices.DeleteFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "debug" })
		}, "--debug-addr port 6070 is not a container port"},
		{"xds without server", "central-xds", func(b *bundle) {
			c := rl(b)
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--xds-server-url") })
		}, "--xds-server-url is not passed explicitly"},
		{"bad flag", "central-standalone", func(b *bundle) {
			c := rl(b)
			c.Args = append(c.Args, "--max-inflight=0")
		}, "the service would not start"},
		{"service monitor port", "central-sentinel", func(b *bundle) {
			objectsOf[*monitoringv1.ServiceMonitor](b)[0].Spec.Endpoints[0].Port = "metrics"
		}, `endpoint port "metrics" is a port of no Service`},
		{"service monitor selector", "central-sentinel", func(b *bundle) {
			objectsOf[*monitoringv1.ServiceMonitor](b)[0].Spec.Selector.MatchLabels["app.kubernetes.io/instance"] = "other"
		}, "matches the labels of no Service"},
		{"service monitor to grpc", "central-sentinel", func(b *bundle) {
			svc := b.object("v1/Service", "ratelimit").obj.(*corev1.Service)
			svc.Spec.Ports[1].TargetPort = svc.Spec.Ports[0].TargetPort
		}, "not --http-addr's 8080"},
		{"rules drift", "sidecar-cluster", func(b *bundle) {
			cm, _ := b.configMap("ratelimit-config")
			cm.Data["edge.yaml"] += "\n"
		}, "edge.yaml differs"},
		{"grace period", "sidecar-standalone", func(b *bundle) {
			b.object("apps/v1/Deployment", "ratelimit-app").obj.(*appsv1.Deployment).Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(int64(15))
		}, "terminationGracePeriodSeconds 15s is not longer"},
		{"redis not admitted", "central-standalone", func(b *bundle) {
			delete(b.object("apps/v1/Deployment", "ratelimit").obj.(*appsv1.Deployment).Spec.Template.Labels, "ratelimit/redis-client")
		}, "does not admit this pod"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := helmTemplate(t, ci(tt.values))
			if ps := b.problems(t); len(ps) > 0 {
				t.Fatalf("problems before the mistake: %v", ps)
			}
			tt.mutate(b)
			ps := b.problems(t)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.problem) }) {
				t.Errorf("no problem mentions %q; got:\n  %s", tt.problem, strings.Join(ps, "\n  "))
			}
		})
	}
}

// TestHelmAgreesWithKustomize: the chart at its defaults renders what the
// kustomize layouts build, object for object (flags, environment, ports,
// probes, resources, security, stopping, Services, budget, autoscaler,
// Redis), names and labels aside: the chart names objects after its
// release, and the checks above hold both to their selectors.
func TestHelmAgreesWithKustomize(t *testing.T) {
	for _, tt := range []struct {
		values, dir string
		names       map[string]string // kustomize name -> chart name, where they differ
	}{
		{"central-standalone", "central", map[string]string{"redis": "ratelimit-redis"}},
		{"sidecar-standalone", "sidecar", map[string]string{"redis": "ratelimit-redis", "app": "ratelimit-app", "envoy-config": envoyChartCM}},
	} {
		t.Run(tt.dir, func(t *testing.T) {
			kb := build(t, filepath.Join(k8sDir, tt.dir))
			hb := helmTemplate(t, filepath.Join(chartDir, "ci", tt.values+".yaml"))
			paired := map[*object]bool{}
			for _, ko := range kb.objects {
				name := ko.name
				if n, ok := tt.names[name]; ok {
					name = n
				}
				ho := hb.object(ko.kind, name)
				if ho == nil {
					t.Errorf("the chart renders no %s %s (kustomize's %s)", ko.kind, name, ko.name)
					continue
				}
				paired[ho] = true
				if k, h := normalized(t, kb, ko), normalized(t, hb, ho); k != h {
					t.Errorf("%s %s: kustomize and the chart differ:\n%s", ko.kind, ko.name, lineDiff(k, h))
				}
			}
			for _, ho := range hb.objects {
				if !paired[ho] {
					t.Errorf("the chart renders %s %s, which kustomize's %s layout has not", ho.kind, ho.name, tt.dir)
				}
			}
		})
	}
}

// normalized is an object's spec as JSON, without what names it or selects
// by name (checked by problems), ConfigMaps referred to by their content.
func normalized(t *testing.T, b *bundle, o *object) string {
	t.Helper()
	var spec any
	pod := func(p *corev1.PodTemplateSpec) {
		p.Labels, p.Annotations = nil, nil
		for i := range p.Spec.TopologySpreadConstraints {
			p.Spec.TopologySpreadConstraints[i].LabelSelector = nil
		}
		for i := range p.Spec.Volumes {
			if cmv := p.Spec.Volumes[i].ConfigMap; cmv != nil {
				if cm, _ := b.configMap(cmv.Name); cm != nil {
					cmv.Name = "content:" + contentHash(t, cm.Data)
				}
			}
		}
		// The pod's user, or the container's own: what each container runs as.
		psc := p.Spec.SecurityContext
		w := workload{template: p}
		for _, c := range w.containers() {
			if psc != nil && c.SecurityContext != nil {
				c.SecurityContext.RunAsUser = cmp.Or(c.SecurityContext.RunAsUser, psc.RunAsUser)
				c.SecurityContext.RunAsGroup = cmp.Or(c.SecurityContext.RunAsGroup, psc.RunAsGroup)
			}
			for i, e := range c.Env {
				if strings.HasPrefix(e.Name, "RATELIMIT_REDIS") || strings.HasPrefix(e.Name, "REDIS_") {
					c.Env[i].Value = "(the Redis of the build)"
				}
			}
		}
		if psc != nil {
			psc.RunAsUser, psc.RunAsGroup = nil, nil
		}
	}
	switch v := o.obj.(type) {
	case *appsv1.Deployment:
		s := v.Spec.DeepCopy()
		s.Selector = nil
		pod(&s.Template)
		spec = s
	case *appsv1.StatefulSet:
		s := v.Spec.DeepCopy()
		s.Selector, s.ServiceName = nil, ""
		pod(&s.Template)
		spec = s
	case *corev1.Service:
		s := v.Spec.DeepCopy()
		s.Selector = nil
		spec = s
	case *policyv1.PodDisruptionBudget:
		s := v.Spec.DeepCopy()
		s.Selector = nil
		spec = s
	case *autoscalingv2.HorizontalPodAutoscaler:
		s := v.Spec.DeepCopy()
		s.ScaleTargetRef.Name = ""
		spec = s
	case *networkingv1.NetworkPolicy:
		s := v.Spec.DeepCopy()
		s.PodSelector = metav1.LabelSelector{}
		spec = s
	case *corev1.ConfigMap:
		spec = v.Data
	default:
		t.Fatalf("%s %s: no normal form", o.kind, o.name)
	}
	out, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func contentHash(t *testing.T, data map[string]string) string {
	t.Helper()
	out, err := json.Marshal(data)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(out)
	return hex.EncodeToString(sum[:8])
}

// lineDiff shows the lines of a that b lacks (-) and those of b that a
// lacks (+), in order: enough to see which field differs.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
