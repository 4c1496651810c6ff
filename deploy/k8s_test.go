package deploy

import (
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// ---------------------------------------------------------------------------
// Tests.

func TestKustomizeRulesConfigMap(t *testing.T) {
	b := build(t, rulesDir)
	if len(b.objects) != 1 {
		t.Fatalf("%s builds %d objects, want the one ConfigMap", rulesDir, len(b.objects))
	}
	cm, g := b.configMap("ratelimit-config")
	if cm == nil || g == nil {
		t.Fatalf("%s does not generate ConfigMap ratelimit-config", rulesDir)
	}
	if g.hashed {
		t.Error("ratelimit-config gets a hash suffix: an update would create a new ConfigMap, not swap the mounted one")
	}
	for _, p := range rulesConfigMapProblems(t, cm, config.YAMLFiles) {
		t.Error(p)
	}
}

func TestKustomizeSidecar(t *testing.T) {
	b := build(t, filepath.Join(k8sDir, "sidecar"))
	requireNoProblems(t, b)

	o := b.object("apps/v1/Deployment", "app")
	if o == nil {
		t.Fatal("no Deployment app")
	}
	w := workload{"Deployment", "app", o.obj.(*appsv1.Deployment).Spec.Selector, &o.obj.(*appsv1.Deployment).Spec.Template}
	rl, envoy, app := w.container("ratelimit"), w.container("envoy"), w.container("app")
	if rl == nil || envoy == nil || app == nil {
		t.Fatal("the app pod needs containers ratelimit, envoy and app")
	}
	isInit := slices.ContainsFunc(w.template.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "ratelimit" })
	if rl.RestartPolicy == nil || *rl.RestartPolicy != corev1.ContainerRestartPolicyAlways || !isInit {
		t.Error("ratelimit is not a native sidecar (an init container with restartPolicy Always): Envoy could start before it or outlive it")
	}
	if rl.StartupProbe == nil || rl.StartupProbe.GRPC == nil {
		t.Error("the ratelimit sidecar has no gRPC startup probe: the app containers would not wait for it to serve")
	}

	// Envoy's bootstrap: deploy/envoy.yaml byte for byte, mounted where -c
	// reads it, rolled out on change.
	cm, g := b.configMap("envoy-config")
	if cm == nil || g == nil {
		t.Fatal("no generated ConfigMap envoy-config")
	}
	if !g.hashed {
		t.Error("envoy-config has a stable name: a change would not restart Envoy, which reads its bootstrap only at start")
	}
	envoyYAML := string(readFile(t, envoyFile))
	if len(cm.Data) != 1 || cm.Data["envoy.yaml"] != envoyYAML {
		t.Errorf("envoy-config data is not %s byte for byte: cp %s %s", envoyFile, envoyFile, g.files["envoy.yaml"])
	}
	ef := flags(envoy.Args)
	var envoyMount *corev1.VolumeMount
	for i, m := range envoy.VolumeMounts {
		if strings.HasPrefix(ef["c"], m.MountPath+"/") {
			envoyMount = &envoy.VolumeMounts[i]
		}
	}
	if envoyMount == nil || strings.TrimPrefix(ef["c"], envoyMount.MountPath+"/") != "envoy.yaml" {
		t.Errorf("envoy -c %q is not envoy.yaml of a mounted volume", ef["c"])
	} else if v := volumeNamed(w, envoyMount.Name); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != "envoy-config" {
		t.Errorf("envoy's config volume %s is not ConfigMap envoy-config", envoyMount.Name)
	}
	if _, ok := ef["disable-hot-restart"]; !ok {
		t.Error("envoy runs without --disable-hot-restart")
	}

	// The image is the Envoy release whose API the tests validate against.
	if proto := envoyAPIVersion(t); !strings.HasPrefix(strings.TrimPrefix(envoy.Image, "envoyproxy/envoy:"), proto+".") {
		t.Errorf("envoy image %s, but %s is validated with the protos of Envoy %s (go-control-plane/envoy in go.mod): move them together",
			envoy.Image, envoyFile, proto)
	}

	// Ports line up with the bootstrap.
	bs, _ := loadBootstrap(t)
	e := newEdge(t, bs)
	svc := b.object("v1/Service", "app").obj.(*corev1.Service)
	if len(svc.Spec.Ports) != 1 {
		t.Errorf("Service app exposes %d ports, want only Envoy's listener", len(svc.Spec.Ports))
	}
	for _, p := range svc.Spec.Ports {
		if n, ok := containerPort(envoy, p.TargetPort); !ok || uint32(n) != e.listenerPort {
			t.Errorf("Service app port %s targets %s, want Envoy's listener %d", p.Name, p.TargetPort.String(), e.listenerPort)
		}
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		if !selects(np.Spec.PodSelector.MatchLabels, w.template.Labels) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if n, ok := containerPort(envoy, *p.Port); !ok || uint32(n) != e.listenerPort {
					t.Errorf("NetworkPolicy %s admits port %s, want only Envoy's listener %d", np.Name, p.Port.String(), e.listenerPort)
				}
			}
		}
	}
	endpoint := func(cluster string) (string, uint32) {
		sa := e.clusters[cluster].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		return sa.GetAddress(), sa.GetPortValue()
	}
	grpcPort, _ := containerPort(rl, intstr.FromString("grpc"))
	rlCluster := e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if host, port := endpoint(rlCluster); host != "127.0.0.1" || port != uint32(grpcPort) {
		t.Errorf("Envoy's rate limit cluster is %s:%d, the sidecar serves gRPC on 127.0.0.1:%d", host, port, grpcPort)
	}
	appListen := flags(app.Args)["listen"]
	appCluster := e.vhost.GetRoutes()[0].GetRoute().GetCluster()
	if host, port := endpoint(appCluster); appListen != net.JoinHostPort(host, strconv.Itoa(int(port))) || host != "127.0.0.1" {
		t.Errorf("Envoy's app cluster is %s:%d, the app listens on %q (want loopback, the same address)", host, port, appListen)
	}

	// The readiness probe is not rate limited: it reaches the app through
	// Envoy on a route without rate_limits.
	rp := envoy.ReadinessProbe
	if rp == nil || rp.HTTPGet == nil {
		t.Fatal("envoy has no HTTP readiness probe")
	}
	if n, _ := containerPort(envoy, rp.HTTPGet.Port); uint32(n) != e.listenerPort {
		t.Errorf("envoy's readiness probe goes to port %d, not the listener %d", n, e.listenerPort)
	}
	if got := e.emulate(t, request{"GET", rp.HTTPGet.Path, nil, "10.0.0.1"}); got.route == "" || len(got.descriptors) > 0 {
		t.Errorf("readiness probe GET %s: route %q, descriptors %q: want a route without rate limits",
			rp.HTTPGet.Path, got.route, descStrings(got.descriptors))
	}
}

func TestKustomizeCentral(t *testing.T) {
	b := build(t, filepath.Join(k8sDir, "central"))
	requireNoProblems(t, b)

	for _, id := range []string{
		"apps/v1/Deployment ratelimit", "v1/Service ratelimit", "v1/Service ratelimit-headless",
		"policy/v1/PodDisruptionBudget ratelimit", "autoscaling/v2/HorizontalPodAutoscaler ratelimit",
		"v1/ConfigMap ratelimit-config", "apps/v1/StatefulSet redis", "v1/Service redis",
	} {
		kind, name, _ := strings.Cut(id, " ")
		if b.object(kind, name) == nil {
			t.Errorf("no %s", id)
		}
	}
	d := b.object("apps/v1/Deployment", "ratelimit").obj.(*appsv1.Deployment)
	w := workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template}
	rl := w.container("ratelimit")
	if rl == nil {
		t.Fatal("no container ratelimit")
	}
	svc := b.object("v1/Service", "ratelimit").obj.(*corev1.Service)
	var names []string
	for _, p := range svc.Spec.Ports {
		n, _ := containerPort(rl, p.TargetPort)
		names = append(names, fmt.Sprintf("%s:%d", p.Name, n))
	}
	if want := []string{"grpc:8081", "http:8080"}; !slices.Equal(names, want) {
		t.Errorf("Service ratelimit ports %v, want %v", names, want)
	}

	// The docs' Envoy cluster resolves the headless Service, on its gRPC port.
	c := docsCentralCluster(t)
	sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	host, _, _ := strings.Cut(sa.GetAddress(), ".")
	o := b.object("v1/Service", host)
	if o == nil {
		t.Fatalf("the docs' central cluster resolves %s: no Service %s", sa.GetAddress(), host)
	}
	hs := o.obj.(*corev1.Service)
	if hs.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Errorf("Service %s is not headless: Envoy would see one address and pin its connection to one pod", hs.Name)
	}
	if len(hs.Spec.Ports) != 1 || uint32(hs.Spec.Ports[0].Port) != sa.GetPortValue() {
		t.Errorf("Service %s ports %v, the docs' cluster dials %d", hs.Name, hs.Spec.Ports, sa.GetPortValue())
	} else if n, _ := containerPort(rl, hs.Spec.Ports[0].TargetPort); n != 8081 || hs.Spec.PublishNotReadyAddresses {
		t.Errorf("Service %s should reach only ready pods' gRPC port", hs.Name)
	}
}

// TestKustomizeChecksCatchMistakes breaks the builds in typical ways and
// expects the checks to say so.
func TestKustomizeChecksCatchMistakes(t *testing.T) {
	deployment := func(b *bundle, name string) *appsv1.Deployment {
		return b.object("apps/v1/Deployment", name).obj.(*appsv1.Deployment)
	}
	container := func(b *bundle, dep, name string) *corev1.Container {
		d := deployment(b, dep)
		return workload{"Deployment", d.Name, d.Spec.Selector, &d.Spec.Template}.container(name)
	}
	for _, tt := range []struct {
		name    string
		dir     string
		mutate  func(b *bundle)
		problem string
	}{
		{"service selector typo", "central", func(b *bundle) {
			b.object("v1/Service", "ratelimit").obj.(*corev1.Service).Spec.Selector["app.kubernetes.io/name"] = "ratelimt"
		}, "matches no pod template"},
		{"service target port", "central", func(b *bundle) {
			b.object("v1/Service", "ratelimit").obj.(*corev1.Service).Spec.Ports[0].TargetPort = intstr.FromString("gprc")
		}, "does not declare"},
		{"probe port", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").LivenessProbe.GRPC.Port = 9090
		}, "livenessProbe port 9090 is not a port of the container"},
		{"grace period", "central", func(b *bundle) {
			deployment(b, "ratelimit").Spec.Template.Spec.TerminationGracePeriodSeconds = ptr(int64(10))
		}, "terminationGracePeriodSeconds 10s is not longer"},
		{"drain timeout not explicit", "sidecar", func(b *bundle) {
			c := container(b, "app", "ratelimit")
			c.Args = slices.DeleteFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--drain-timeout") })
		}, "--drain-timeout is not passed explicitly"},
		{"store timeout set", "central", func(b *bundle) {
			c := container(b, "ratelimit", "ratelimit")
			c.Args = append(c.Args, "--store-timeout=15ms")
		}, "--store-timeout is set"},
		{"config volume typo", "sidecar", func(b *bundle) {
			deployment(b, "app").Spec.Template.Spec.Volumes[0].ConfigMap.Name = "ratelimit-conf"
		}, `ConfigMap "ratelimit-conf" is not in the build`},
		{"config path", "sidecar", func(b *bundle) {
			container(b, "app", "ratelimit").Args[0] = "--config=/etc/ratelimit"
		}, "nothing is mounted at --config=/etc/ratelimit"},
		{"config subPath", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").VolumeMounts[0].SubPath = "edge.yaml"
		}, "subPath"},
		{"rules drift", "central", func(b *bundle) {
			cm, _ := b.configMap("ratelimit-config")
			cm.Data["edge.yaml"] = strings.Replace(cm.Data["edge.yaml"], "requests_per_unit: 5\n", "requests_per_unit: 50\n", 1)
		}, "edge.yaml differs"},
		{"hpa target", "central", func(b *bundle) {
			objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b)[0].Spec.ScaleTargetRef.Name = "rate-limit"
		}, "is not a Deployment of the build"},
		{"replicas with hpa", "central", func(b *bundle) {
			deployment(b, "ratelimit").Spec.Replicas = ptr(int32(3))
		}, "sets replicas"},
		{"pdb selector", "central", func(b *bundle) {
			objectsOf[*policyv1.PodDisruptionBudget](b)[0].Spec.Selector.MatchLabels["app.kubernetes.io/instance"] = "other"
		}, "is not the selector of a Deployment"},
		{"writable root", "sidecar", func(b *bundle) {
			container(b, "app", "envoy").SecurityContext.ReadOnlyRootFilesystem = nil
		}, "readOnlyRootFilesystem is not true"},
		{"no limits", "sidecar", func(b *bundle) {
			container(b, "app", "app").Resources.Limits = nil
		}, "resources need requests and limits of cpu"},
		{"limit below request", "central", func(b *bundle) {
			container(b, "ratelimit", "ratelimit").Resources.Limits[corev1.ResourceMemory] = resource.MustParse("16Mi")
		}, "memory limit 16Mi below request 64Mi"},
		{"redis not admitted", "central", func(b *bundle) {
			delete(deployment(b, "ratelimit").Spec.Template.Labels, "ratelimit/redis-client")
		}, "does not admit this pod"},
		{"redis url host", "sidecar", func(b *bundle) {
			container(b, "app", "ratelimit").Env[0].Value = "redis://redis-master:6379/0"
		}, "is not a Service of the build"},
		{"redis evicts", "central", func(b *bundle) {
			c := redisContainer(b)
			c.Args[slices.Index(c.Args, "--maxmemory-policy")+1] = "volatile-ttl"
		}, `--maxmemory-policy "volatile-ttl": want noeviction`},
		{"redis maxmemory at the limit", "central", func(b *bundle) {
			c := redisContainer(b)
			c.Args[slices.Index(c.Args, "--maxmemory")+1] = "256mb"
		}, "--maxmemory 256mb is more than 3/4 of the memory limit"},
		{"redis without maxmemory", "central", func(b *bundle) {
			c := redisContainer(b)
			i := slices.Index(c.Args, "--maxmemory")
			c.Args = slices.Delete(c.Args, i, i+2)
		}, `--maxmemory "": want a size`},
		{"unpinned image", "sidecar", func(b *bundle) {
			container(b, "app", "envoy").Image = "envoyproxy/envoy:latest"
		}, "is not pinned"},
		{"missing label", "central", func(b *bundle) {
			delete(b.object("v1/Service", "ratelimit-headless").labels, "app.kubernetes.io/part-of")
		}, "no label app.kubernetes.io/part-of"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := build(t, filepath.Join(k8sDir, tt.dir))
			tt.mutate(b)
			ps := b.problems(t)
			if !slices.ContainsFunc(ps, func(p string) bool { return strings.Contains(p, tt.problem) }) {
				t.Errorf("no problem mentions %q; got:\n  %s", tt.problem, strings.Join(ps, "\n  "))
			}
		})
	}

	// Decoding is strict, and only known kinds pass.
	for _, tt := range []struct{ name, doc, err string }{
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 2}\n", "unknown field"},
		{"misplaced field", "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: [{port: 80, containerPort: 80}]}\n", "unknown field"},
		{"unknown kind", "apiVersion: v1\nkind: Servce\nmetadata: {name: x}\n", "unknown apiVersion/kind"},
		{"old api version", "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nmetadata: {name: x}\n", "unknown apiVersion/kind"},
		{"duplicate key", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\nmetadata: {name: y}\n", `key "metadata" already set`},
		{"namespace", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: default}\n", "namespace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeManifest("test.yaml", []byte(tt.doc))
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("error %v, want one containing %q", err, tt.err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func redisContainer(b *bundle) *corev1.Container {
	return &b.object("apps/v1/StatefulSet", "redis").obj.(*appsv1.StatefulSet).Spec.Template.Spec.Containers[0]
}

func volumeNamed(w workload, name string) *corev1.Volume {
	for i := range w.template.Spec.Volumes {
		if w.template.Spec.Volumes[i].Name == name {
			return &w.template.Spec.Volumes[i]
		}
	}
	return nil
}

// envoyAPIVersion returns "vMAJOR.MINOR" of the go-control-plane/envoy module
// the tests are built with: the Envoy release whose API they validate.
func envoyAPIVersion(t *testing.T) string {
	t.Helper()
	list := exec.Command(goTool(t), "list", "-m", "-f", "{{.Version}}", "github.com/envoyproxy/go-control-plane/envoy")
	list.Dir = repoRoot
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -m github.com/envoyproxy/go-control-plane/envoy: %v", err)
	}
	version := strings.TrimSpace(string(out))
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 3 {
		t.Fatalf("go-control-plane/envoy version %q", version)
	}
	return parts[0] + "." + parts[1]
}
