package tokenizer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// templateFiles are where transformers finds a tokenizer's chat template beside
// tokenizer_config.json's "chat_template" key.
var templateFiles = []string{"chat_template.jinja", "chat_template.json"}

// isTokenizerFile says whether a file in the folder shapes tokenization: the tokenizer's
// own files, its remote code, and the configs that name special tokens or the vocab.
// Weights are not read.
func isTokenizerFile(name string) bool {
	switch name {
	case "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
		"vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model", "config.json", "generation_config.json":
		return true
	}
	return strings.HasSuffix(name, ".tiktoken") || (strings.HasPrefix(name, "tokenization") && strings.HasSuffix(name, ".py"))
}

// Identity digests what a prepared dataset depends on in a tokenizer folder: the
// tokenizer's files, and the chat template (templateFile when given, else the folder's
// chat_template.* files and tokenizer_config.json's chat_template key), apart, so a
// changed template alone is named as such.
func Identity(dir, templateFile string) (tokenizer, template string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", "", fmt.Errorf("tokenizer folder %s: %w", dir, err)
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && isTokenizerFile(e.Name()) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	th := sha256.New()
	for _, n := range names {
		if err := hashInto(th, filepath.Join(dir, n), n); err != nil {
			return "", "", err
		}
	}
	mh := sha256.New()
	if templateFile != "" {
		if err := hashInto(mh, templateFile, "file"); err != nil {
			return "", "", err
		}
	} else {
		for _, n := range templateFiles {
			if err := hashInto(mh, filepath.Join(dir, n), n); err != nil && !errors.Is(err, os.ErrNotExist) {
				return "", "", err
			}
		}
		tc, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return "", "", err
		}
		fmt.Fprintf(mh, "tokenizer_config.chat_template=%s\n", tc["chat_template"])
	}
	return hex.EncodeToString(th.Sum(nil)), hex.EncodeToString(mh.Sum(nil)), nil
}

func hashInto(h io.Writer, path, name string) error {
	f, err := openRegular(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	fmt.Fprintf(h, "%s\n", name)
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	_, err = fmt.Fprintf(h, "\n")
	return err
}

func openRegular(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	return f, nil
}

// readConfig reads a JSON object, keeping each value's raw text.
func readConfig(path string) (map[string]json.RawMessage, error) {
	f, err := openRegular(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ModelVocabSize is the target's vocabulary size from the model folder's config.json:
// vocab_size, or text_config.vocab_size for a model with a vision part (Kimi-K2.5).
func ModelVocabSize(dir string) (int, error) {
	m, err := readConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return 0, err
	}
	var v int
	if raw, ok := m["vocab_size"]; ok && json.Unmarshal(raw, &v) == nil && v > 0 {
		return v, nil
	}
	var text struct {
		VocabSize int `json:"vocab_size"`
	}
	if raw, ok := m["text_config"]; ok && json.Unmarshal(raw, &text) == nil && text.VocabSize > 0 {
		return text.VocabSize, nil
	}
	return 0, fmt.Errorf("%s: no vocab_size (nor text_config.vocab_size)", filepath.Join(dir, "config.json"))
}

// Check is doctor's look at a tokenizer folder before any GPU time: it exists and is
// readable, holds tokenizer files and a chat template (or templateFile does), and needs
// no remote code the config did not allow.
func Check(dir, templateFile string, trustRemoteCode bool) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("tokenizer folder %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("tokenizer folder %s is not a directory", dir)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("tokenizer folder %s is unreadable: %w", dir, err)
	}
	have := map[string]bool{}
	files := false
	for _, e := range entries {
		have[e.Name()] = true
		if n := e.Name(); n == "tokenizer.json" || n == "tokenizer.model" || n == "vocab.json" || strings.HasSuffix(n, ".tiktoken") {
			files = true
		}
	}
	if !files {
		return fmt.Errorf("tokenizer folder %s has no tokenizer.json, tokenizer.model, vocab.json or *.tiktoken", dir)
	}
	tc, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("tokenizer folder %s: %w", dir, err)
	}
	for _, n := range templateFiles {
		if have[n] {
			if f, err := openRegular(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("tokenizer folder %s: %w", dir, err)
			} else {
				_ = f.Close()
			}
		}
	}
	if raw, ok := tc["auto_map"]; ok && !trustRemoteCode {
		var am map[string]json.RawMessage
		if json.Unmarshal(raw, &am) == nil {
			if t, ok := am["AutoTokenizer"]; ok {
				return fmt.Errorf("tokenizer folder %s needs remote code (tokenizer_config.json auto_map.AutoTokenizer = %s); set prepare.trust_remote_code: true if you trust that code", dir, t)
			}
		}
	}
	if templateFile != "" {
		f, err := openRegular(templateFile)
		if err != nil {
			return fmt.Errorf("prepare.chat_template: %w", err)
		}
		_ = f.Close()
		return nil
	}
	if _, ok := tc["chat_template"]; !ok && !have["chat_template.jinja"] && !have["chat_template.json"] {
		return fmt.Errorf("tokenizer folder %s has no chat template (tokenizer_config.json chat_template, chat_template.jinja); name one in prepare.chat_template", dir)
	}
	return nil
}
