package podinject

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
)

// nativeSidecarsSince is the first Kubernetes version with native sidecars on by default.
var nativeSidecarsSince = version.MajorMinor(1, 29)

// NewServer returns the webhook server for cfg, for ctrl.Options.WebhookServer.
func NewServer(cfg Config) webhook.Server {
	return webhook.NewServer(webhook.Options{Port: cfg.Port, CertDir: cfg.CertDir})
}

// Setup registers the pod injection webhook with mgr. In self-signed mode it first makes sure a
// certificate is in the cert dir (the webhook server reads it when it starts) and adds the
// rotator that keeps it valid.
func Setup(mgr ctrl.Manager, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("checking webhook configuration: %w", err)
	}
	log := mgr.GetLogger().WithName("podinject")

	native, err := resolveNative(cfg.NativeSidecars, mgr.GetConfig(), log)
	if err != nil {
		return err
	}

	if cfg.CertMode == CertModeSelfSigned {
		direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme()})
		if err != nil {
			return fmt.Errorf("creating client for the webhook certificate: %w", err)
		}
		rot := &CertRotator{Client: direct, Config: cfg, Interval: time.Hour, Log: log.WithName("certs")}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := rot.Ensure(ctx); err != nil {
			return fmt.Errorf("preparing the self-signed webhook certificate: %w", err)
		}
		if err := mgr.Add(rot); err != nil {
			return fmt.Errorf("adding the webhook certificate rotator: %w", err)
		}
	}

	srv := mgr.GetWebhookServer()
	srv.Register(Path, &webhook.Admission{Handler: NewHandler(NewInjector(cfg, native), mgr.GetScheme(), log)})
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return fmt.Errorf("adding the webhook readiness check: %w", err)
	}
	log.Info("pod injection webhook registered", "path", Path, "nativeSidecars", native,
		"certMode", cfg.CertMode, "sidecarImage", cfg.SidecarImage)
	return nil
}

// resolveNative turns the --native-sidecars setting into a decision, asking the API server
// its version in auto mode. When it cannot tell, it injects a regular container: that works on
// every version, where an init container with restartPolicy is refused before 1.29.
func resolveNative(setting string, cfg *rest.Config, log logr.Logger) (bool, error) {
	switch setting {
	case NativeSidecarsTrue:
		return true, nil
	case NativeSidecarsFalse:
		return false, nil
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, fmt.Errorf("creating discovery client: %w", err)
	}
	info, err := dc.ServerVersion()
	if err != nil {
		log.Error(err, "reading the API server version; injecting regular sidecar containers")
		return false, nil
	}
	v, err := serverVersion(info.GitVersion, info.Major, info.Minor)
	if err != nil {
		log.Error(err, "parsing the API server version; injecting regular sidecar containers")
		return false, nil
	}
	return v.AtLeast(nativeSidecarsSince), nil
}

// serverVersion parses gitVersion ("v1.30.2-eks-1234"), or else major and minor ("1", "29+").
func serverVersion(gitVersion, major, minor string) (*version.Version, error) {
	if v, err := version.ParseGeneric(gitVersion); err == nil {
		return v, nil
	}
	v, err := version.ParseGeneric(strings.TrimSuffix(major, "+") + "." + strings.TrimSuffix(minor, "+"))
	if err != nil {
		return nil, fmt.Errorf("parsing server version %q (%s.%s): %w", gitVersion, major, minor, err)
	}
	return v, nil
}
