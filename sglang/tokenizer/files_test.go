package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func folder(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCheckRefusesAFolderThatCannotServeNamingWhy(t *testing.T) {
	good := map[string]string{"tokenizer.json": "{}", "tokenizer_config.json": `{"chat_template": "x"}`}
	for _, tc := range []struct {
		name  string
		dir   string
		trust bool
		want  string
	}{
		{"missing", filepath.Join(t.TempDir(), "nope"), false, "no such file"},
		{"no tokenizer files", folder(t, map[string]string{"config.json": "{}"}), false, "has no tokenizer.json"},
		{"no chat template", folder(t, map[string]string{"tokenizer.json": "{}"}), false, "has no chat template"},
		{"remote code not allowed", folder(t, map[string]string{"tiktoken.model": "", "kimi.tiktoken": "", "chat_template.jinja": "x",
			"tokenizer_config.json": `{"auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", null]}}`}), false, "prepare.trust_remote_code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.dir, "", tc.trust)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if err := Check(folder(t, good), "", false); err != nil {
		t.Fatalf("a good folder: %v", err)
	}
	kimi := folder(t, map[string]string{"kimi.tiktoken": "", "chat_template.jinja": "x", "tokenizer_config.json": `{"auto_map": {"AutoTokenizer": ["t.T", null]}}`})
	if err := Check(kimi, "", true); err != nil {
		t.Fatalf("remote code allowed: %v", err)
	}
}

func TestIdentityNamesATemplateChangeApartFromTheTokenizers(t *testing.T) {
	dir := folder(t, map[string]string{"tokenizer.json": `{"v":1}`, "tokenizer_config.json": `{}`, "chat_template.jinja": "a", "model.safetensors": "weights"})
	tok1, tmpl1, err := Identity(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("b"), 0o644)
	os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("other weights"), 0o644)
	tok2, tmpl2, _ := Identity(dir, "")
	if tok1 != tok2 || tmpl1 == tmpl2 {
		t.Fatalf("template change: tokenizer %v, template %v (want only the template to change)", tok1 != tok2, tmpl1 != tmpl2)
	}
	os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"v":2}`), 0o644)
	if tok3, tmpl3, _ := Identity(dir, ""); tok3 == tok2 || tmpl3 != tmpl2 {
		t.Fatal("a tokenizer change was not seen apart from the template")
	}
}

func TestModelVocabSizeReadsTextConfigToo(t *testing.T) {
	if v, err := ModelVocabSize(folder(t, map[string]string{"config.json": `{"text_config": {"vocab_size": 163840}}`})); err != nil || v != 163840 {
		t.Fatalf("%d, %v", v, err)
	}
	if _, err := ModelVocabSize(folder(t, map[string]string{"config.json": `{}`})); err == nil {
		t.Fatal("no vocab_size accepted")
	}
}
