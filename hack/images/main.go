// Command images packs static binaries into container images without a container daemon: one
// layer over an empty base (as FROM scratch), the binary at /<name>, /tmp, and the config of the
// Dockerfile's distroless images (non-root 65532:65532, the binary as the entrypoint). Each
// image is written as an image archive that `ctr images import` and `docker load` read, and,
// with -push, pushed to its registry.
//
// The images are reproducible: the layer's entries carry fixed times, owners and modes, and the
// config carries no creation time, so the same binaries give the same digests.
//
// Usage:
//
//	images -out DIR [-push] [-label k=v]... REF=BINARY...
//
// writes DIR/<basename of BINARY>.tar holding REF.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// nonRoot is the user and group of distroless's "nonroot", which the Dockerfile's images run as.
const nonRoot = "65532:65532"

// maxBinary bounds what is read into memory for one layer.
const maxBinary = 512 << 20

type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }

func (l labels) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("label %q: want key=value", s)
	}
	l[k] = v
	return nil
}

func main() {
	out := flag.String("out", "", "directory for the image archives")
	push := flag.Bool("push", false, "also push each image to its reference's registry")
	lbls := labels{}
	flag.Var(lbls, "label", "an image label key=value (repeatable)")
	flag.Parse()
	if err := run(*out, *push, lbls, flag.Args()); err != nil {
		slog.Error("images", "err", err)
		os.Exit(1)
	}
}

func run(out string, push bool, lbls labels, args []string) error {
	if out == "" || len(args) == 0 {
		return errors.New("usage: images -out DIR [-push] [-label k=v]... REF=BINARY [REF=BINARY]")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", out, err)
	}
	for _, arg := range args {
		refStr, bin, ok := strings.Cut(arg, "=")
		if !ok {
			return fmt.Errorf("argument %q: want REF=BINARY", arg)
		}
		ref, err := name.NewTag(refStr, name.WeakValidation)
		if err != nil {
			return fmt.Errorf("parsing image reference %q: %w", refStr, err)
		}
		img, err := build(bin, lbls)
		if err != nil {
			return err
		}
		path := filepath.Join(out, filepath.Base(bin)+".tar")
		if err := tarball.WriteToFile(path, ref, img); err != nil {
			return fmt.Errorf("writing %s to %s: %w", ref, path, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return fmt.Errorf("digest of %s: %w", ref, err)
		}
		slog.Info("image written", "ref", ref.String(), "digest", digest.String(), "archive", path)
		if push {
			if err := remote.Write(ref, img, remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
				return fmt.Errorf("pushing %s: %w", ref, err)
			}
			slog.Info("image pushed", "ref", ref.String(), "digest", digest.String())
		}
	}
	return nil
}

// build packs the static binary at path as /<basename> over an empty base.
func build(path string, lbls labels) (v1.Image, error) {
	entry := "/" + filepath.Base(path)
	layerTar, err := layer(path, entry)
	if err != nil {
		return nil, err
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer of %s: %w", path, err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, l)
	if err != nil {
		return nil, fmt.Errorf("adding the layer of %s: %w", path, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config of %s: %w", path, err)
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = []string{entry}
	cfg.Config.User = nonRoot
	cfg.Config.WorkingDir = "/"
	cfg.Config.Env = []string{"PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin"}
	cfg.Config.Labels = lbls
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return nil, fmt.Errorf("setting the config of %s: %w", path, err)
	}
	return img, nil
}

// layer is the uncompressed tar of one layer: /tmp (1777, as in distroless) and the binary.
func layer(path, entry string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening binary: %w", err)
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxBinary {
		return nil, fmt.Errorf("%s: want a regular file of at most %d bytes", path, maxBinary)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return nil, fmt.Errorf("writing /tmp: %w", err)
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(entry, "/"), Mode: 0o755, Size: st.Size(), ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return nil, fmt.Errorf("writing %s: %w", entry, err)
	}
	if _, err := io.CopyN(tw, f, st.Size()); err != nil {
		return nil, fmt.Errorf("copying %s: %w", path, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer of %s: %w", path, err)
	}
	return buf.Bytes(), nil
}
