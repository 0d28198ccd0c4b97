"""extract's transformers server: SGLang's HTTP subset over a Hugging Face causal LM.

It answers the same endpoints extract's client uses against SGLang (/generate,
/health, /health_generate, /server_info, /get_server_info, /model_info), runs each
batch's prefill with output_hidden_states=True, and writes dump protocol v1 through
extract_hook.writer, the writer the SGLang hook uses. See ../README.md.

Everything here imports without torch except backend.load_transformers and the batch
worker, which import it when they run.
"""

SERVER_VERSION = "1.0.0"
