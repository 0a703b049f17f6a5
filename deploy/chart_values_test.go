package deploy_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/turnout/turnout/internal/config"
	"github.com/turnout/turnout/lab/testenv/kubetest"
	"github.com/turnout/turnout/route/policy"
)

// helm lint --strict refuses a typo anywhere in the values, in the chart's
// own keys and in turnout's config inside them, with the path.
func TestHelmLintRefusesTypos(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, tc := range []struct{ set, want string }{
		{"replicas=2", "replicas"},
		{"serviceMonitor.enable=true", "enable"},
		{"extraVolume[0].name=x", "extraVolume"},
		{"nginx.mode=heder", "mode"},
		{"networkPolicy.adminFrom[0].podSelector.matchLabels.app=prom,networkPolicy.enable=true", "enable"},
		{"deployments[0].name=llama,deployments[0].policy.name=prefix-afinity,deployments[0].pools[0].role=mixed", "prefix-afinity"},
		{"deployments[0].name=llama,deployments[0].pools[0].role=mixd", "role"},
		{"deployments[0].name=llama,deployments[0].pools[0].discovery.kubernetes.servce=vllm", "servce"},
		{"config.sesion_headers[0]=x-session-id", "sesion_headers"},
		{"feedback.tokenSecret.nmae=x", "nmae"},
	} {
		_, err := run(t, helm, "lint", "--strict", chart, "--set", tc.set)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("helm lint --strict --set %s: want a refusal naming %q, got %v", tc.set, tc.want, err)
		}
	}
}

// schemaNode is the part of values.schema.json the tests read.
type schemaNode struct {
	Type                 any                    `json:"type"`
	Ref                  string                 `json:"$ref"`
	Enum                 []any                  `json:"enum"`
	AdditionalProperties any                    `json:"additionalProperties"`
	Properties           map[string]*schemaNode `json:"properties"`
	Items                *schemaNode            `json:"items"`
	Definitions          map[string]*schemaNode `json:"definitions"`
}

func loadSchema(t *testing.T) *schemaNode {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chart, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s schemaNode
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

// yamlKeys lists the YAML keys of struct type v, sorted.
func yamlKeys(v any) []string {
	var out []string
	rt := reflect.TypeOf(v)
	for i := 0; i < rt.NumField(); i++ {
		tag, _, _ := strings.Cut(rt.Field(i).Tag.Get("yaml"), ",")
		if tag != "" && tag != "-" {
			out = append(out, tag)
		}
	}
	sort.Strings(out)
	return out
}

func propKeys(n *schemaNode) []string {
	var out []string
	for k := range n.Properties {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func enumStrings(n *schemaNode) []string {
	var out []string
	for _, e := range n.Enum {
		out = append(out, e.(string))
	}
	sort.Strings(out)
	return out
}

// The schema's enums are turnout's names (the policy registry, the pool
// roles, the nginx modes), the objects that mirror turnout's config list
// exactly its fields, and every object the schema defines refuses other
// keys.
func TestSchemaFollowsTurnout(t *testing.T) {
	s := loadSchema(t)
	def := s.Definitions
	if got, want := enumStrings(def["policy"].Properties["name"]), policy.DefaultRegistry().Names(); !slices.Equal(got, want) {
		t.Errorf("policy name enum %q, the registry has %q", got, want)
	}
	if got, want := enumStrings(def["pool"].Properties["role"]), []string{config.RoleDecode, config.RoleMixed, config.RolePrefill}; !slices.Equal(got, want) {
		t.Errorf("role enum %q, want %q", got, want)
	}
	modes := []string{config.NginxModeBody, config.NginxModeHeader}
	for name, n := range map[string]*schemaNode{"nginx.mode": s.Properties["nginx"].Properties["mode"], "nginx_mode": def["deployment"].Properties["nginx_mode"]} {
		if got := enumStrings(n); !slices.Equal(got, modes) {
			t.Errorf("%s enum %q, want %q", name, got, modes)
		}
	}
	if got := enumStrings(s.Properties["proxy"]); !slices.Equal(got, []string{"epp", "haproxy", "nginx"}) {
		t.Errorf("proxy enum %q", got)
	}
	for name, tc := range map[string]struct {
		node *schemaNode
		typ  any
	}{
		"deployment":           {def["deployment"], config.DeploymentConfig{}},
		"pool":                 {def["pool"], config.PoolConfig{}},
		"policy":               {def["policy"], config.PolicyConfig{}},
		"discovery":            {def["pool"].Properties["discovery"], config.DiscoveryConfig{}},
		"discovery.kubernetes": {def["kubernetes"], config.KubernetesDiscovery{}},
		"config":               {s.Properties["config"], config.Config{}},
	} {
		if got, want := propKeys(tc.node), yamlKeys(tc.typ); !slices.Equal(got, want) {
			t.Errorf("schema %s lists %q, turnout's config has %q", name, got, want)
		}
	}
	// Every object with properties refuses the keys it does not list.
	var walk func(path string, n *schemaNode)
	walk = func(path string, n *schemaNode) {
		if n == nil {
			return
		}
		if len(n.Properties) > 0 && n.AdditionalProperties != false {
			t.Errorf("schema %s: additionalProperties must be false", path)
		}
		for k, p := range n.Properties {
			walk(path+"."+k, p)
		}
		walk(path+"[]", n.Items)
	}
	walk("values", s)
	for k, d := range def {
		walk("definitions."+k, d)
	}
}

// turnoutBin is the turnout binary: $TURNOUT_BIN (make build), else built
// from ../cmd/turnout.
func turnoutBin(t *testing.T) string {
	t.Helper()
	if b := os.Getenv("TURNOUT_BIN"); b != "" {
		return b
	}
	bin := filepath.Join(t.TempDir(), "turnout")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/turnout")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ../cmd/turnout: %v: %s", err, out)
	}
	return bin
}

// checkRendered pipes `helm template` of the chart (values args) into
// `turnout check -`, as docs/kubernetes.md tells operators to, and returns
// check's error and its log (JSON lines).
func checkRendered(t *testing.T, helm, bin string, args ...string) (error, string) {
	t.Helper()
	out, err := run(t, helm, append([]string{"template", "turnout", chart, "--namespace", "llm"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "check", "-")
	cmd.Stdin = bytes.NewReader(out)
	cmd.Env = append(os.Environ(), "TURNOUT_LOG_FORMAT=json")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	return cmd.Run(), logs.String()
}

// Every profile's rendered config passes turnout check (haproxy -c and
// nginx -t when installed) without a warning; header mode with several
// deployments and a prefix policy, which the chart lets an operator set,
// is warned about.
func TestChartTurnoutCheck(t *testing.T) {
	helm := kubetest.Helm(t)
	bin := turnoutBin(t)
	for _, p := range profiles {
		err, logs := checkRendered(t, helm, bin, "-f", valuesFile(p))
		if err != nil {
			t.Errorf("profile %s: turnout check: %v\n%s", p, err, logs)
			continue
		}
		if strings.Contains(logs, `"config warning"`) || !strings.Contains(logs, `"config ok"`) {
			t.Errorf("profile %s: want config ok without warnings:\n%s", p, logs)
		}
	}
	err, logs := checkRendered(t, helm, bin, "-f", valuesFile("monitoring"), "--set", "proxy=nginx,nginx.mode=header,deployments[0].policy.name=prefix-affinity")
	if err != nil {
		t.Fatalf("header mode: %v\n%s", err, logs)
	}
	for _, want := range []string{"400 model_required", "policy prefix-affinity reads the prompt"} {
		if !strings.Contains(logs, want) {
			t.Errorf("header mode over two deployments: no warning %q:\n%s", want, logs)
		}
	}
}

// kinds returns the rendered objects of kind k.
func kinds(objs []*unstructured.Unstructured, k string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == k {
			out = append(out, o)
		}
	}
	return out
}

// The client-facing Service exposes only the client port, the admin
// listener has a Service of its own (the ServiceMonitor's only match), the
// optional NetworkPolicy opens the client port to all and the admin port
// to adminFrom only, the proxy containers have liveness probes, and nginx
// mode renders no haproxy: key (its drain goes under nginx:).
func TestChartServicesAndPolicy(t *testing.T) {
	helm := kubetest.Helm(t)
	for _, prof := range profiles {
		objs := render(t, helm, prof, "llm")
		p, err := podOf(objs)
		if err != nil {
			t.Fatal(err)
		}
		client := "http"
		if prof == "epp" {
			client = "grpc-ext-proc"
		}
		var admin *corev1.Service
		for _, o := range kinds(objs, "Service") {
			var svc corev1.Service
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &svc); err != nil {
				t.Fatal(err)
			}
			var ports []string
			for _, sp := range svc.Spec.Ports {
				ports = append(ports, sp.Name)
			}
			switch svc.Name {
			case "turnout":
				if !slices.Equal(ports, []string{client}) {
					t.Errorf("profile %s: the client Service exposes %q, want only %q", prof, ports, client)
				}
			case "turnout-admin":
				admin = &svc
				if !slices.Equal(ports, []string{"admin"}) || svc.Spec.Type != corev1.ServiceTypeClusterIP {
					t.Errorf("profile %s: admin Service %s with ports %q, want ClusterIP with admin", prof, svc.Spec.Type, ports)
				}
			default:
				t.Errorf("profile %s: unexpected Service %s", prof, svc.Name)
			}
		}
		if admin == nil {
			t.Errorf("profile %s: no admin Service", prof)
		}
		for _, sm := range kinds(objs, "ServiceMonitor") {
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			for _, o := range kinds(objs, "Service") {
				matches := true
				for k, v := range sel {
					matches = matches && o.GetLabels()[k] == v
				}
				if matches != (o.GetName() == "turnout-admin") {
					t.Errorf("profile %s: ServiceMonitor selects Service %s: %v", prof, o.GetName(), matches)
				}
			}
		}
		nps := kinds(objs, "NetworkPolicy")
		if (len(nps) == 1) != (prof == "monitoring") {
			t.Errorf("profile %s: %d NetworkPolicies (only the monitoring profile enables one)", prof, len(nps))
		}
		for _, o := range nps {
			var np networkingv1.NetworkPolicy
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &np); err != nil {
				t.Fatal(err)
			}
			if len(np.Spec.Ingress) != 2 {
				t.Fatalf("profile %s: want two ingress rules, got %+v", prof, np.Spec.Ingress)
			}
			open, adm := np.Spec.Ingress[0], np.Spec.Ingress[1]
			if len(open.From) != 0 || open.Ports[0].Port.String() != "http" {
				t.Errorf("profile %s: the client port must be open to all: %+v", prof, open)
			}
			if adm.Ports[0].Port.String() != "admin" || len(adm.From) != 1 || adm.From[0].NamespaceSelector == nil {
				t.Errorf("profile %s: the admin port must be open to adminFrom only: %+v", prof, adm)
			}
		}
		for _, c := range p.dep.Spec.Template.Spec.Containers {
			if c.LivenessProbe == nil {
				t.Errorf("profile %s: container %s has no liveness probe", prof, c.Name)
			}
		}
		if prof == "nginx" {
			for _, o := range kinds(objs, "ConfigMap") {
				y, _, _ := unstructured.NestedString(o.Object, "data", "turnout.yaml")
				if strings.Contains(y, "\nhaproxy:") || strings.HasPrefix(y, "haproxy:") {
					t.Errorf("profile nginx: turnout.yaml has a haproxy: key:\n%s", y)
				}
			}
			if p.cfg.Nginx.Mode != config.NginxModeBody {
				t.Errorf("profile nginx: nginx.mode %q, want turnout's default body", p.cfg.Nginx.Mode)
			}
			// The pod's drain reaches turnout's discovery under nginx's key.
			if g := p.dep.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || p.cfg.DiscoveryDrain() < time.Duration(*g)*time.Second-time.Minute {
				t.Errorf("profile nginx: discovery drains %v for a pod grace of %v s", p.cfg.DiscoveryDrain(), g)
			}
		}
	}
}
