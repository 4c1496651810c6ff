package deploy

import (
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/settings"
)

// ---------------------------------------------------------------------------
// Checks, as a list of problems so that the tests can also prove that a
// broken manifest is caught.

// recommended labels every object and pod carries.
var recommendedLabels = []string{"app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of"}

// ratelimitImage is the image name the manifests use for this service, which
// the kustomizations' images entries point at the real one.
const ratelimitImage = "ratelimit"

func (b *bundle) problems(t *testing.T) []string {
	t.Helper()
	var ps []string
	add := func(format string, args ...any) { ps = append(ps, fmt.Sprintf(format, args...)) }

	for _, o := range b.objects {
		for _, l := range recommendedLabels {
			if o.labels[l] == "" {
				add("%s %s (%s): no label %s", o.kind, o.name, o.source, l)
			}
		}
	}

	for _, w := range b.workloads() {
		spec := &w.template.Spec
		sel := w.selector
		if sel == nil || len(sel.MatchExpressions) > 0 || !selects(sel.MatchLabels, w.template.Labels) {
			add("%s: selector %v does not match its pod template's labels", w, sel)
		}
		for _, l := range recommendedLabels {
			if w.template.Labels[l] == "" {
				add("%s: pod template has no label %s", w, l)
			}
		}
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			add("%s: automountServiceAccountToken is not false", w)
		}
		if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
			add("%s: enableServiceLinks is not false", w)
		}
		if spec.TerminationGracePeriodSeconds == nil {
			add("%s: no terminationGracePeriodSeconds", w)
		}
		psc := spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
			add("%s: pod securityContext.runAsNonRoot is not true", w)
		}
		if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			add("%s: pod securityContext.seccompProfile is not RuntimeDefault", w)
		}

		volumes := map[string]*corev1.Volume{}
		for i := range spec.Volumes {
			v := &spec.Volumes[i]
			volumes[v.Name] = v
			if cmv := v.ConfigMap; cmv != nil {
				cm, _ := b.configMap(cmv.Name)
				if cm == nil {
					add("%s: volume %s: ConfigMap %q is not in the build", w, v.Name, cmv.Name)
					continue
				}
				for _, it := range cmv.Items {
					if _, ok := cm.Data[it.Key]; !ok {
						add("%s: volume %s: ConfigMap %s has no key %s", w, v.Name, cmv.Name, it.Key)
					}
				}
			}
		}
		mounted := map[string]bool{}
		portNames := map[string]string{}
		portNumbers := map[int32]string{}
		for _, c := range w.containers() {
			where := fmt.Sprintf("%s container %s", w, c.Name)
			for _, m := range c.VolumeMounts {
				mounted[m.Name] = true
				if volumes[m.Name] == nil {
					add("%s: volumeMount %s: no such volume", where, m.Name)
				}
			}
			if name, tag := imageName(c.Image), strings.TrimPrefix(c.Image, imageName(c.Image)); tag == "" || tag == ":latest" || name == ratelimitImage {
				add("%s: image %q is not pinned to a tag", where, c.Image)
			}
			sc := c.SecurityContext
			if sc == nil {
				add("%s: no securityContext", where)
			} else {
				if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
					add("%s: allowPrivilegeEscalation is not false", where)
				}
				if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
					add("%s: readOnlyRootFilesystem is not true", where)
				}
				if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
					add("%s: capabilities are not drop [ALL]", where)
				}
				if sc.Privileged != nil && *sc.Privileged {
					add("%s: privileged", where)
				}
				if sc.RunAsUser != nil && *sc.RunAsUser == 0 || sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
					add("%s: runs as root", where)
				}
			}
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				req, okReq := c.Resources.Requests[r]
				lim, okLim := c.Resources.Limits[r]
				if !okReq || !okLim || req.IsZero() {
					add("%s: resources need requests and limits of %s", where, r)
				} else if lim.Cmp(req) < 0 {
					add("%s: %s limit %s below request %s", where, r, lim.String(), req.String())
				}
			}
			if imageName(c.Image) == "redis" {
				for _, p := range redisProblems(c) {
					add("%s: %s", where, p)
				}
			}
			for _, p := range c.Ports {
				if errs := validation.IsValidPortName(p.Name); len(errs) > 0 {
					add("%s: port name %q: %s", where, p.Name, strings.Join(errs, "; "))
				}
				if prev, dup := portNames[p.Name]; dup {
					add("%s: port name %s also in container %s", where, p.Name, prev)
				}
				if prev, dup := portNumbers[p.ContainerPort]; dup {
					add("%s: port %d also in container %s", where, p.ContainerPort, prev)
				}
				portNames[p.Name], portNumbers[p.ContainerPort] = c.Name, c.Name
			}
			probes := map[string]*corev1.Probe{"startupProbe": c.StartupProbe, "readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe}
			for _, kind := range slices.Sorted(maps.Keys(probes)) {
				p := probes[kind]
				if p == nil {
					if kind != "startupProbe" && len(c.Ports) > 0 {
						add("%s: serves ports but has no %s", where, kind)
					}
					continue
				}
				var port intstr.IntOrString
				switch {
				case p.GRPC != nil:
					port = intstr.FromInt32(p.GRPC.Port)
				case p.HTTPGet != nil:
					port = p.HTTPGet.Port
				case p.TCPSocket != nil:
					port = p.TCPSocket.Port
				case p.Exec != nil:
					continue
				}
				if _, ok := containerPort(c, port); !ok {
					add("%s: %s port %s is not a port of the container", where, kind, port.String())
				}
			}
			if c.Name == ratelimitImage {
				ps = append(ps, b.ratelimitProblems(t, w, c)...)
			}
		}
		for name := range volumes {
			if !mounted[name] {
				add("%s: volume %s is mounted by no container", w, name)
			}
		}
	}

	for _, s := range objectsOf[*corev1.Service](b) {
		where := "Service " + s.Name
		targets := b.selected(s.Spec.Selector)
		if len(targets) == 0 {
			add("%s: selector %v matches no pod template", where, s.Spec.Selector)
		}
		for _, w := range targets {
			for _, p := range s.Spec.Ports {
				if _, ok := podPort(w, p.TargetPort); !ok {
					add("%s: port %s targets %s, which %s does not declare", where, p.Name, p.TargetPort.String(), w)
				}
			}
		}
	}
	for _, ss := range objectsOf[*appsv1.StatefulSet](b) {
		o := b.object("v1/Service", ss.Spec.ServiceName)
		if o == nil || o.obj.(*corev1.Service).Spec.ClusterIP != corev1.ClusterIPNone ||
			!selects(o.obj.(*corev1.Service).Spec.Selector, ss.Spec.Template.Labels) {
			add("StatefulSet %s: serviceName %q is not a headless Service selecting it", ss.Name, ss.Spec.ServiceName)
		}
	}

	hpaTargets := map[string]*autoscalingv2.HorizontalPodAutoscaler{}
	for _, h := range objectsOf[*autoscalingv2.HorizontalPodAutoscaler](b) {
		where := "HorizontalPodAutoscaler " + h.Name
		ref := h.Spec.ScaleTargetRef
		o := b.object("apps/v1/"+ref.Kind, ref.Name)
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || o == nil {
			add("%s: scaleTargetRef %s %s %s is not a Deployment of the build", where, ref.APIVersion, ref.Kind, ref.Name)
			continue
		}
		hpaTargets[ref.Name] = h
		d := o.obj.(*appsv1.Deployment)
		if d.Spec.Replicas != nil {
			add("%s: Deployment %s sets replicas, which every apply would reset", where, d.Name)
		}
		if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
			add("%s: minReplicas must be at least 2 and at most maxReplicas", where)
		}
		for _, m := range h.Spec.Metrics {
			if m.Type != autoscalingv2.ResourceMetricSourceType || m.Resource == nil {
				add("%s: metric %s: only Resource metrics are checked here", where, m.Type)
				continue
			}
			for _, c := range d.Spec.Template.Spec.Containers {
				if _, ok := c.Resources.Requests[m.Resource.Name]; !ok {
					add("%s: utilization of %s needs a request on container %s", where, m.Resource.Name, c.Name)
				}
			}
		}
	}
	for _, p := range objectsOf[*policyv1.PodDisruptionBudget](b) {
		where := "PodDisruptionBudget " + p.Name
		var target *appsv1.Deployment
		for _, d := range objectsOf[*appsv1.Deployment](b) {
			if p.Spec.Selector != nil && maps.Equal(p.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) {
				target = d
			}
		}
		if target == nil {
			add("%s: selector %v is not the selector of a Deployment of the build", where, p.Spec.Selector)
			continue
		}
		if (p.Spec.MaxUnavailable == nil) == (p.Spec.MinAvailable == nil) {
			add("%s: set exactly one of maxUnavailable and minAvailable", where)
		}
		if p.Spec.MaxUnavailable != nil && p.Spec.MaxUnavailable.IntValue() < 1 {
			add("%s: maxUnavailable %s blocks every drain", where, p.Spec.MaxUnavailable.String())
		}
		if hpaTargets[target.Name] == nil && (target.Spec.Replicas == nil || *target.Spec.Replicas < 2) {
			add("%s: Deployment %s may run a single replica, which the budget would block", where, target.Name)
		}
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		where := "NetworkPolicy " + np.Name
		targets := b.selected(np.Spec.PodSelector.MatchLabels)
		if len(targets) == 0 {
			add("%s: podSelector matches no pod template", where)
		}
		for _, rule := range np.Spec.Ingress {
			for _, port := range rule.Ports {
				for _, w := range targets {
					if port.Port == nil {
						continue
					}
					if _, ok := podPort(w, *port.Port); !ok {
						add("%s: port %s is not declared by %s", where, port.Port.String(), w)
					}
				}
			}
			for _, from := range rule.From {
				if from.PodSelector != nil && len(b.selected(from.PodSelector.MatchLabels)) == 0 {
					add("%s: from podSelector %v matches no pod template", where, from.PodSelector.MatchLabels)
				}
			}
		}
	}
	for _, sm := range objectsOf[*monitoringv1.ServiceMonitor](b) {
		ps = append(ps, b.serviceMonitorProblems(sm)...)
	}
	return ps
}

// serviceMonitorProblems checks that a ServiceMonitor scrapes /metrics where
// the service serves it: a port of the Services it selects (by their own
// labels) that leads to the service's --http-addr.
func (b *bundle) serviceMonitorProblems(sm *monitoringv1.ServiceMonitor) []string {
	var ps []string
	add := func(format string, args ...any) {
		ps = append(ps, "ServiceMonitor "+sm.Name+": "+fmt.Sprintf(format, args...))
	}
	var services []*corev1.Service
	for _, s := range objectsOf[*corev1.Service](b) {
		if len(sm.Spec.Selector.MatchExpressions) == 0 && selects(sm.Spec.Selector.MatchLabels, s.Labels) {
			services = append(services, s)
		}
	}
	if len(services) == 0 {
		add("selector %v matches the labels of no Service", sm.Spec.Selector.MatchLabels)
	}
	for _, ep := range sm.Spec.Endpoints {
		if ep.Path != "" && ep.Path != "/metrics" {
			add("endpoint path %q: the service serves /metrics", ep.Path)
		}
		scraped := 0
		for _, svc := range services {
			for _, sp := range svc.Spec.Ports {
				if sp.Name != ep.Port {
					continue
				}
				scraped++
				for _, w := range b.selected(svc.Spec.Selector) {
					c := w.container(ratelimitImage)
					if c == nil {
						continue
					}
					n, _ := containerPort(c, sp.TargetPort)
					s, err := resolveSettings(c)
					if err != nil {
						continue // reported with the container
					}
					if httpPort, err := addrPort(s.HTTPAddr); err == nil && n != httpPort {
						add("endpoint port %s reaches %d in %s, not --http-addr's %d, where /metrics is", ep.Port, n, w, httpPort)
					}
				}
			}
		}
		if scraped == 0 {
			add("endpoint port %q is a port of no Service it selects", ep.Port)
		}
	}
	return ps
}

// redisProblems checks a Redis container's memory settings. An evicted
// counter admits again within its window, so Redis must refuse writes
// (noeviction: the service's failure modes answer) rather than evict, and
// maxmemory must leave the container room for what it does not count
// (fragmentation, client buffers, Lua), or the kernel kills Redis first.
func redisProblems(c *corev1.Container) []string {
	var ps []string
	f := flags(c.Args)
	if got := f["maxmemory-policy"]; got != "noeviction" {
		ps = append(ps, fmt.Sprintf("--maxmemory-policy %q: want noeviction (an evicted counter admits again)", got))
	}
	maxmemory, err := redisBytes(f["maxmemory"])
	limit, okLimit := c.Resources.Limits[corev1.ResourceMemory]
	switch {
	case err != nil || maxmemory == 0:
		ps = append(ps, fmt.Sprintf("--maxmemory %q: want a size below the memory limit (%v)", f["maxmemory"], err))
	case !okLimit:
		ps = append(ps, "no memory limit to size --maxmemory against")
	case maxmemory*4 > limit.Value()*3:
		ps = append(ps, fmt.Sprintf("--maxmemory %s is more than 3/4 of the memory limit %s", f["maxmemory"], limit.String()))
	}
	return ps
}

// redisBytes parses a Redis memory size: a number of bytes, or with k, kb,
// m, mb, g, gb (k = 1000, kb = 1024, as redis.conf says).
func redisBytes(v string) (int64, error) {
	v = strings.ToLower(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"gb", 1 << 30}, {"mb", 1 << 20}, {"kb", 1 << 10}, {"g", 1e9}, {"m", 1e6}, {"k", 1e3}} {
		if strings.HasSuffix(v, u.suffix) {
			v, mult = strings.TrimSuffix(v, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n * mult, err
}

// ratelimitProblems checks a container running this service against the
// settings it would start with (its flags, or the reference's variables),
// its config and the rest of the build.
func (b *bundle) ratelimitProblems(t *testing.T, w workload, c *corev1.Container) []string {
	t.Helper()
	var ps []string
	where := fmt.Sprintf("%s container %s", w, c.Name)
	add := func(format string, args ...any) { ps = append(ps, where+": "+fmt.Sprintf(format, args...)) }
	s, err := resolveSettings(c)
	if err != nil {
		add("%v", err)
		return ps
	}
	xds := s.XDS.ConfigType == settings.ConfigTypeXDS
	source := settings.FlagConfig
	if xds {
		source = "xds-server-url"
	}
	for _, name := range []string{source, settings.FlagGRPCAddr, settings.FlagHTTPAddr, "drain-timeout"} {
		if !s.explicit[name] {
			add("--%s is not passed explicitly", name)
		}
	}
	for _, p := range s.secretProblems() {
		add("%s", p)
	}

	// The rules: a whole ConfigMap mounted as the --config directory, or
	// none over xDS.
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if m.MountPath == s.ConfigPath {
			mount = &c.VolumeMounts[i]
		}
	}
	switch {
	case xds: // the rules come over the stream: nothing to mount
	case mount == nil:
		add("nothing is mounted at --config=%s", s.ConfigPath)
	default:
		if mount.SubPath != "" || mount.SubPathExpr != "" {
			add("the config is mounted with subPath, which the kubelet never updates")
		}
		var vol *corev1.Volume
		for i := range w.template.Spec.Volumes {
			if w.template.Spec.Volumes[i].Name == mount.Name {
				vol = &w.template.Spec.Volumes[i]
			}
		}
		switch {
		case vol == nil || vol.ConfigMap == nil:
			add("--config is not a ConfigMap volume")
		case len(vol.ConfigMap.Items) > 0:
			add("the config volume picks items: mount the whole ConfigMap")
		default:
			cm, g := b.configMap(vol.ConfigMap.Name)
			if cm == nil {
				break // reported with the volumes
			}
			if g != nil && g.hashed {
				add("ConfigMap %s gets a hash suffix: an update would create a new ConfigMap, not swap the mounted one", cm.Name)
			}
			files, err := config.ParseFileSet(s.ConfigFiles)
			if err != nil {
				add("--config-files %q: %v", s.ConfigFiles, err)
				break
			}
			ps = append(ps, rulesConfigMapProblems(t, cm, files)...)
		}
	}

	// Ports, probes and the store.
	grpcPort, err := addrPort(s.GRPCAddr)
	if err != nil {
		add("--grpc-addr %q: %v", s.GRPCAddr, err)
	}
	if p, ok := containerPort(c, intstr.FromString("grpc")); !ok || p != grpcPort {
		add("container port grpc is %d, --grpc-addr listens on %d", p, grpcPort)
	}
	for _, l := range []struct{ flag, addr string }{
		{settings.FlagHTTPAddr, s.HTTPAddr}, {settings.FlagDebugAddr, s.DebugAddr}, {settings.FlagMetricsAddr, s.MetricsAddr},
	} {
		if l.addr == "" && l.flag != settings.FlagHTTPAddr {
			continue
		}
		if port, err := addrPort(l.addr); err != nil {
			add("--%s %q: %v", l.flag, l.addr, err)
		} else if _, ok := containerPort(c, intstr.FromInt32(port)); !ok {
			add("--%s port %d is not a container port", l.flag, port)
		}
	}
	healthServices := []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName}
	for kind, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.GRPC == nil || p.GRPC.Port != grpcPort {
			add("%s probe is not a gRPC probe on %d", kind, grpcPort)
		} else if !slices.Contains(healthServices, ptrValue(p.GRPC.Service)) {
			add("%s probe asks for health service %q, which the service does not register", kind, ptrValue(p.GRPC.Service))
		}
	}
	if c.ReadinessProbe != nil && c.ReadinessProbe.GRPC != nil && ptrValue(c.ReadinessProbe.GRPC.Service) != healthServices[1] {
		add("readiness probe should ask for %s", healthServices[1])
	}
	if s.explicit["store-timeout"] {
		// The service takes its deadline from Envoy's; a --store-timeout
		// below it would cut a burst's queueing short and answer by
		// failure mode what the deadline still had time for.
		add("--store-timeout is set: leave it at its default, Envoy's filter timeout governs")
	}

	// Stopping: the grace period covers the preStop sleeps, the shutdown
	// delay (serving while NOT_SERVING) and the drain.
	grace := time.Duration(ptrValue(w.template.Spec.TerminationGracePeriodSeconds)) * time.Second
	if need := preStopSleep(w) + s.ShutdownDelay + s.DrainTimeout; grace <= need {
		add("terminationGracePeriodSeconds %v is not longer than the preStop sleep plus --drain-timeout (%v)", grace, need)
	}

	// Redis: one store, every server of it a Service of the build on a
	// port its pods serve (a name without a dot resolves in the pod's own
	// namespace, so it must be in the build; a dotted one is elsewhere and
	// not checked), and a NetworkPolicy (when there is one) that admits this
	// pod.
	endpoints, err := s.redisEndpoints()
	if err != nil {
		add("%v", err)
		return ps
	}
	if len(endpoints) != 1 {
		add("%d Redis URLs (%v): want exactly one, or each replica counts alone on the embedded store", len(endpoints), endpoints)
		return ps
	}
	for _, addr := range endpoints[0].addrs {
		host, portText, err := net.SplitHostPort(addr)
		if err != nil {
			add("%s %s: %v", endpoints[0].env, addr, err)
			continue
		}
		if strings.Contains(host, ".") {
			continue
		}
		ps = append(ps, b.redisServiceProblems(w, where, endpoints[0].env, host, portText)...)
	}
	return ps
}

// redisServiceProblems checks that host:port, a Redis the pod of w dials, is
// a Service of the build that its NetworkPolicies let the pod reach.
func (b *bundle) redisServiceProblems(w workload, where, env, host, portText string) []string {
	var ps []string
	add := func(format string, args ...any) { ps = append(ps, where+": "+fmt.Sprintf(format, args...)) }
	port, _ := strconv.ParseInt(portText, 10, 32)
	svcObj := b.object("v1/Service", host)
	if svcObj == nil {
		add("%s host %s is not a Service of the build", env, host)
		return ps
	}
	svc := svcObj.obj.(*corev1.Service)
	if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == int32(port) }) {
		add("%s port %d is not a port of Service %s", env, port, svc.Name)
		return ps
	}
	for _, np := range objectsOf[*networkingv1.NetworkPolicy](b) {
		for _, rw := range b.selected(np.Spec.PodSelector.MatchLabels) {
			if !selects(svc.Spec.Selector, rw.template.Labels) {
				continue
			}
			admitted := false
			for _, rule := range np.Spec.Ingress {
				for _, from := range rule.From {
					if from.PodSelector != nil && selects(from.PodSelector.MatchLabels, w.template.Labels) {
						admitted = true
					}
				}
			}
			if !admitted {
				add("NetworkPolicy %s does not admit this pod to %s", np.Name, rw)
			}
		}
	}
	return ps
}

func ptrValue[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// rulesConfigMapProblems checks that a rules ConfigMap holds exactly the files
// of deploy/config, byte for byte, and that the service loads it the way the
// kubelet mounts it (the files are symlinks into a "..data" directory),
// reading the files the service is told to (--config-files).
func rulesConfigMapProblems(t *testing.T, cm *corev1.ConfigMap, files config.FileSet) []string {
	t.Helper()
	var ps []string
	keys := slices.Sorted(maps.Keys(cm.Data))
	if want := ruleFiles(t); !slices.Equal(keys, want) {
		ps = append(ps, fmt.Sprintf("ConfigMap %s has keys %v, want the rule files of %s: %v", cm.Name, keys, rulesDir, want))
	}
	for _, k := range keys {
		if want, err := os.ReadFile(filepath.Join(rulesDir, k)); err != nil || cm.Data[k] != string(want) {
			ps = append(ps, fmt.Sprintf("ConfigMap %s: %s differs from %s/%s", cm.Name, k, rulesDir, k))
		}
	}
	dir := t.TempDir()
	stamp := filepath.Join(dir, "..2026_01_01_00_00_00.000000001")
	if err := os.Mkdir(stamp, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := os.WriteFile(filepath.Join(stamp, k), []byte(cm.Data[k]), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", k), filepath.Join(dir, k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Base(stamp), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	got, err := config.Load(dir, config.Defaults{Files: files})
	if err != nil {
		return append(ps, fmt.Sprintf("ConfigMap %s, mounted: %v", cm.Name, err))
	}
	var gotRules, wantRules []string
	for _, r := range got.Rules() {
		gotRules = append(gotRules, fmt.Sprintf("%s %s %d/%s", r, r.Name, r.RequestsPerUnit, r.Unit))
	}
	for _, r := range loadRules(t).Rules() {
		wantRules = append(wantRules, fmt.Sprintf("%s %s %d/%s", r, r.Name, r.RequestsPerUnit, r.Unit))
	}
	if !slices.Equal(gotRules, wantRules) || len(got.Files()) != len(keys) {
		ps = append(ps, fmt.Sprintf("ConfigMap %s, mounted, loads rules %v from %d files; want %v from %d",
			cm.Name, gotRules, len(got.Files()), wantRules, len(keys)))
	}
	return ps
}

func requireNoProblems(t *testing.T, b *bundle) {
	t.Helper()
	for _, p := range b.problems(t) {
		t.Errorf("%s: %s", b.dir, p)
	}
}
