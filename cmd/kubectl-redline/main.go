// Command kubectl-redline answers "why was this request refused?" from what the cluster holds:
//
//	kubectl redline explain [-n NS] (--pod POD | --labels k=v,...) [-X METHOD] [-H 'Name: value']... [--remote-addr IP] PATH
//	kubectl redline status  [-n NS] [POLICY]
//
// explain reads the namespace's compiled configuration (ConfigMap redline-policies, what every
// sidecar enforces), keeps the policies that select the pod, and tells for each rule whether it
// matches the request and the hash it counts the request's key under: the hash the policy's
// status shows in its top refused keys. It runs the sidecar's own matching and key code and
// spends nothing. status prints a policy's conditions, its rules' refusals and top refused keys,
// and its candidates. Installed on PATH as kubectl-redline, kubectl runs it as a plugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const usage = `kubectl redline: why was this request refused?

  kubectl redline explain [-n NS] (--pod POD | --labels k=v,...) [-X METHOD] [-H 'Name: value']... [--remote-addr IP] [--trusted-hops N] PATH
      Which rules of the policies that select the pod match the request, and the hash each counts
      its key under (as shown in the policy's status.rules[].topRefused). Spends nothing.
  kubectl redline status [-n NS] [POLICY]
      A policy's conditions (all of the namespace's when POLICY is omitted), its rules' refusals,
      top refused keys and candidates.

Flags common to both: --kubeconfig, --context, -n/--namespace.
`

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-redline:", err)
		if _, ok := errors.AsType[usageError](err); ok {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is an error in how the command was called.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// common are the flags every subcommand takes.
type common struct {
	kubeconfig, context, namespace string
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&c.context, "context", "", "the kubeconfig context to use")
	fs.StringVar(&c.namespace, "namespace", "", "the namespace (default: the context's)")
	fs.StringVar(&c.namespace, "n", "", "shorthand for --namespace")
}

// client connects as kubectl would and returns the namespace to use.
func (c *common) client() (client.Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = c.kubeconfig
	cfg := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: c.context})
	rest, err := cfg.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("reading the kubeconfig: %w", err)
	}
	rest.Timeout = 30 * time.Second
	ns := c.namespace
	if ns == "" {
		if ns, _, err = cfg.Namespace(); err != nil {
			return nil, "", fmt.Errorf("reading the kubeconfig's namespace: %w", err)
		}
	}
	cl, err := client.New(rest, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, "", fmt.Errorf("connecting to the API server: %w", err)
	}
	return cl, ns, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return usageError{"a subcommand is required: explain or status"}
	}
	switch args[0] {
	case "explain":
		return explain(ctx, args[1:], out)
	case "status":
		return status(ctx, args[1:], out)
	case "-h", "--help", "help":
		_, err := fmt.Fprint(out, usage)
		return err
	}
	return usageError{fmt.Sprintf("unknown subcommand %q", args[0])}
}
