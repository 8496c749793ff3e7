"""Package discovery lives here because pyproject.toml cannot combine `find` with a mapped
package: the top-level `templates/` folder is installed as the package `ggmlpy.templates`."""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["ggmlpy", "ggmlpy.*", "llama", "llama.*"]) + ["ggmlpy.templates"],
    package_dir={"ggmlpy.templates": "templates"},
)
