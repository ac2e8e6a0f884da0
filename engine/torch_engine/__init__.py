"""The torch engine: PagedAttention, the C decode kernel, the model runner, LLMEngine, the loader.

Engine mode runs real (tiny or loaded) models through the same BlockManager and Scheduler cost
mode uses. Only this subpackage imports torch.
"""
