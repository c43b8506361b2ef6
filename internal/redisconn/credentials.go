package redisconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// maxCredentialBytes bounds what FileCredentials reads of each file: the files sit in a Secret
// of the pod's namespace, which its tenant can write.
const maxCredentialBytes = 4 << 10

// FileCredentials returns a credentials provider for Options.Credentials that reads the
// username and password from the files named usernameFile and passwordFile in dir, as a
// mounted Secret holds them, at every new connection. When the controller rotates the
// password, kubelet swaps the files and the next connection uses the new one; connections
// already open stay authenticated. A missing password file means fallbackPassword (and no
// username): a Secret not written yet, or a Redis without one.
func FileCredentials(dir, usernameFile, passwordFile, fallbackPassword string) func(context.Context) (string, string, error) {
	return func(context.Context) (string, string, error) {
		pw, err := readCredential(filepath.Join(dir, passwordFile))
		if errors.Is(err, fs.ErrNotExist) {
			return "", fallbackPassword, nil
		}
		if err != nil {
			return "", "", err
		}
		user, err := readCredential(filepath.Join(dir, usernameFile))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", "", err
		}
		return user, pw, nil
	}
}

func readCredential(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCredentialBytes+1))
	if err != nil {
		return "", fmt.Errorf("reading redis credential %s: %w", path, err)
	}
	if len(b) > maxCredentialBytes {
		return "", fmt.Errorf("reading redis credential %s: longer than %d bytes", path, maxCredentialBytes)
	}
	return string(bytes.TrimRight(b, "\r\n")), nil
}
