__version__ = "2.13.0+emu"
git_version = "emulated"
# The CANN version this emulator reports (torch_npu.emulator documents it).
cann = "8.3.RC1"
